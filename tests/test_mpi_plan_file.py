"""Plan files under mpiexec: ranks prove together that each epoch serves every sample once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import write_h5
from ranks_apart import MPIEXEC, run_job

from solar import BufferConfig, Plan, PlanSpec, RunConfig, make_plan
from solar.io.hdf5 import describe
from solar.schedule.keep.planner import EpochPlan

SCRIPT = Path(__file__).parent / "mpi" / "plan_file.py"
N = 61

pytestmark = pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside python")


def _plan(data: Path, path: Path, swap: bool) -> Path:
    info = describe([data])
    run = RunConfig(N, 2, 4, 3, seed=3)
    spec = PlanSpec(run, BufferConfig(12), "solar", False, info.sample_bytes, info.identity)
    plan = make_plan(spec)
    epochs = list(plan.epochs)
    if swap:
        # Rank 1 reads a sample rank 0 also reads in step 0: each rank alone looks consistent.
        a = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in vars(epochs[0]).items()}
        lo0, lo1 = a["rank_offsets"][0], a["rank_offsets"][1]
        a["sample"][lo1] = a["sample"][lo0]
        a["flags"][lo1], a["slot"][lo1] = 0, -1
        epochs[0] = EpochPlan(**a)
    edited = Plan(spec, plan.epoch_order, plan.stats, 0.0, spec.fingerprint, epochs=epochs)
    return edited.save(path)


@pytest.fixture(scope="module")
def plans_job(tmp_path_factory):
    """plan_file.py's one job of 2 ranks: the honest plan, then the edited one (refused: the
    job ends there)."""
    tmp = tmp_path_factory.mktemp("plans")
    data = write_h5(tmp / "d.h5", x=np.arange(N * 3, dtype=np.float32).reshape(N, 3))
    plans = [_plan(data, tmp / f"p{int(swap)}.h5", swap) for swap in (False, True)]
    return run_job(MPIEXEC, 2, [str(SCRIPT), str(data), *map(str, plans)], 240)


@pytest.mark.xdist_group("mpi_plan_file")  # (one worker runs both: the job once)
@pytest.mark.parametrize("swap", [False, True], ids=["honest", "sample-on-two-ranks"])
def test_ranks_validate_a_plan_file_together(plans_job, swap):
    result = plans_job
    # Each rank served the honest plan whole (once), and never the edited one.
    assert [out.count(": ok") for out, _ in result.ranks] == [1, 1], result.ranks
    if swap:
        assert result.returncode != 0
        assert "epoch 0 does not serve each of its samples exactly once" in result.stderr
