"""The stand-in without its OpenAPI check (`ApiServer(openapi=False)`, which the dynamic MIG
publish benchmark uses): a field the schema does not know passes, while the ResourceSlice rules
the schema lacks, such as 1.37's limit of 8 counter sets in one slice, still refuse."""

from __future__ import annotations

import aiohttp
from test_node_config import in_loop

from deviceplugin.model.slices import build_slices
from deviceplugin.sim.apiserver import PREFIX, ApiServer

SLICES = f"{PREFIX}/resourceslices"


def _counter_sets(count: int) -> list[dict[str, object]]:
    return [{"name": f"set-{n}", "counters": {"memory": {"value": "1Gi"}}} for n in range(count)]


@in_loop
async def test_without_the_openapi_check_the_slice_rules_still_refuse() -> None:
    good = build_slices("node-a", [], 1)[0]
    unknown = {**good, "spec": {**good["spec"], "unknownField": 1}}
    shared = {**good, "spec": {**good["spec"], "devices": [], "sharedCounters": _counter_sets(9)}}
    statuses: dict[bool, list[int]] = {}
    for openapi in (True, False):
        server = ApiServer(openapi=openapi)
        await server.start()
        try:
            async with aiohttp.ClientSession() as session:
                statuses[openapi] = []
                for body in (unknown, shared):
                    async with session.post(server.url + SLICES, json=body) as answer:
                        statuses[openapi].append(answer.status)
        finally:
            await server.stop()
        assert any("sharedCounters" in why for why in server.rejected), server.rejected
    assert statuses == {True: [422, 422], False: [201, 422]}
