"""The planner: what is drawn → who keeps what → the Plan, all pure functions of the inputs
(no shared memory, no processes: solar/host/ holds those). Layout: README.md beside this file."""

from solar.schedule.draw.order import epoch_permutation
from solar.schedule.plans.plan import Plan, load_plan, make_plan
from solar.schedule.plans.rankplan import RankPlan, StepPlan
from solar.schedule.policy import ADMIT, DEMOTE, HIT, PEER, POLICIES, RELEASE, SIDE, THIT
from solar.schedule.spec import PlanSpec

__all__ = [
    "ADMIT",
    "DEMOTE",
    "HIT",
    "PEER",
    "POLICIES",
    "RELEASE",
    "SIDE",
    "THIT",
    "Plan",
    "PlanSpec",
    "RankPlan",
    "StepPlan",
    "epoch_permutation",
    "load_plan",
    "make_plan",
]
