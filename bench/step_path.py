"""The path of one plain step through solar's code: which functions of which modules it calls.

    python bench/step_path.py [--steps 3]

A Loader (Shuffle, no tier, no transform, threads=1, read-ahead 2) serves a step in the middle
of epoch 1 while ``sys.setprofile`` records every call made on the consuming thread into a
module of solar (reader threads and the planner's thread are not followed). Printed: the
calls in order (module.function, indented by depth), the functions and modules visited, and
the calls back into a module already on the call stack (A calls B, which calls A again: a
callback).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

from solar import Loader, ReaderConfig


def trace_step(it) -> list[tuple[int, str, str, bool]]:
    """(depth, module, function, back) of every solar call the next step makes on this
    thread; ``back``: a call back into a module already on the call stack, below another one
    (a callee calling its caller's module: A -> B -> A)."""
    calls: list[tuple[int, str, str, bool]] = []
    stack: list[str] = []  # the module of each frame under way

    def profile(frame, event, arg):
        if event == "call":
            mod = frame.f_globals.get("__name__", "")
            if mod.startswith("solar"):
                back = bool(stack) and stack[-1] != mod and mod in stack
                calls.append((len(stack), mod, frame.f_code.co_qualname, back))
            stack.append(mod)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        next(it)
    finally:
        sys.setprofile(None)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="steps into epoch 1 to trace")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.h5"
        with h5py.File(path, "w") as f:
            f["x"] = np.random.default_rng(0).standard_normal((512, 8, 8), np.float32)
        ld = Loader(path, batch_size=16, epochs=2, buffer=128,
                    reader=ReaderConfig(threads=1, read_ahead=2))  # fmt: skip
        ld.set_epoch(0)
        for _ in ld:
            pass
        ld.set_epoch(1)
        it = iter(ld)
        for _ in range(opts.steps):
            next(it)
        calls = trace_step(it)
        ld.close()
    for depth, mod, fn, back in calls:
        print(f"{'  ' * min(depth, 20)}{mod}.{fn}{'   <- back' if back else ''}")
    functions = {(m, f) for _, m, f, _ in calls}
    modules = {m for _, m, _, _ in calls}
    loader = {f for m, f in functions if m == "solar.loader"}
    print(f"\n{len(calls)} calls; {len(functions)} functions in {len(modules)} modules; "
          f"{len(loader)} of them Loader's; {sum(b for *_, b in calls)} calls back into a "
          "module already on the call stack")  # fmt: skip
    print("modules:", ", ".join(sorted(modules)))


if __name__ == "__main__":
    main()
