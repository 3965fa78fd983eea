"""`deviceplugin` and `python -m deviceplugin`: the command line (`program.main`), run with
garbage collection paused while the command starts (`runtime/collector.py`), asyncio loaded
without `ssl` (`runtime/leanimports.py`). Nothing is imported before the pause begins."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from deviceplugin.runtime.collector import paused_for_start_up

    with paused_for_start_up():
        import deviceplugin.runtime.leanimports  # noqa: F401  # before anything loads asyncio
        from deviceplugin.program import main as run

        return run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
