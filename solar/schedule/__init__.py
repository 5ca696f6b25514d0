"""The planner: order → assignment → eviction → Plan, all pure functions of the inputs."""

from solar.schedule._common import ADMIT, DEMOTE, HIT, PEER, RELEASE, SIDE, THIT
from solar.schedule.order import epoch_permutation
from solar.schedule.plan import Plan, load_plan, make_plan
from solar.schedule.policies import POLICIES
from solar.schedule.rankplan import RankPlan, StepPlan
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
