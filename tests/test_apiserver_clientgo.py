"""The API-server stand-in speaks what client-go needs (NVIDIA's DRA driver in `make
bench-reference`): a slice watch-list (`sendInitialEvents=true`) starts with the current slices
and the bookmark that ends them, and a request body of a content type given a decoder is read
by it and then validated as JSON is; `/version` names the Kubernetes release, from which
NVIDIA's driver picks its slice layout."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from test_node_config import in_loop

from deviceplugin.model.slices import build_slices
from deviceplugin.sim.apiserver import INITIAL_EVENTS_END, PREFIX, SERVER_VERSION, ApiServer

SLICES = f"{PREFIX}/resourceslices"


async def _create(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with session.post(url + SLICES, json=body) as answer:
        assert answer.status == 201, await answer.text()


@in_loop
async def test_a_watch_list_sends_the_current_slices_a_bookmark_then_changes() -> None:
    server = ApiServer()
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            for node, driver in (("node-a", "one.example.com"), ("node-b", "one.example.com")):
                await _create(session, server.url, build_slices(node, [], 1, driver)[0])
            await _create(session, server.url, build_slices("node-a", [], 1, "two.example.com")[0])
            query = {
                "watch": "true",
                "sendInitialEvents": "true",
                "resourceVersionMatch": "NotOlderThan",
                "allowWatchBookmarks": "true",
                "fieldSelector": "spec.nodeName=node-a",
            }
            async with session.get(server.url + SLICES, params=query) as watch:
                events = [json.loads(await watch.content.readline()) for _ in range(3)]
                await _create(
                    session, server.url, build_slices("node-a", [], 1, "three.example.com")[0]
                )
                later = json.loads(await watch.content.readline())
    finally:
        await server.stop()
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    assert {e["object"]["spec"]["driver"] for e in events[:2]} == {
        "one.example.com",
        "two.example.com",
    }
    bookmark = events[2]["object"]["metadata"]
    assert bookmark["annotations"] == {INITIAL_EVENTS_END: "true"}
    newest = max(int(e["object"]["metadata"]["resourceVersion"]) for e in events[:2])
    assert int(bookmark["resourceVersion"]) > newest
    assert later["type"] == "ADDED"
    assert later["object"]["spec"]["driver"] == "three.example.com"
    assert int(later["object"]["metadata"]["resourceVersion"]) > int(bookmark["resourceVersion"])


def _utf16(body: bytes) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(body.decode("utf-16"))
    return document


@in_loop
async def test_a_body_of_a_decoded_content_type_is_read_by_its_decoder_and_validated() -> None:
    server = ApiServer(decoders={"application/x-utf16-json": _utf16})
    await server.start()
    good = build_slices("node-a", [], 1)[0]
    bad = {**good, "spec": {**good["spec"], "unknownField": 1}}
    try:
        async with aiohttp.ClientSession() as session:
            statuses = []
            for body in (json.dumps(good).encode("utf-16"), json.dumps(bad).encode("utf-16")):
                headers = {"Content-Type": "application/x-utf16-json"}
                async with session.post(server.url + SLICES, data=body, headers=headers) as answer:
                    statuses.append(answer.status)
            async with session.post(
                server.url + SLICES,
                data=b"\xff",
                headers={"Content-Type": "application/x-utf16-json"},
            ) as answer:
                statuses.append(answer.status)
    finally:
        await server.stop()
    assert statuses == [201, 422, 422]
    assert list(server.slices) == [good["metadata"]["name"]]
    assert "unknownField" in server.rejected[0]
    assert server.rejected[1].startswith("body is not application/x-utf16-json")


@in_loop
async def test_version_names_the_clusters_kubernetes() -> None:
    server = ApiServer()
    await server.start()
    try:
        async with aiohttp.ClientSession() as session, session.get(server.url + "/version") as got:
            assert got.status == 200
            assert await got.json() == SERVER_VERSION
    finally:
        await server.stop()
