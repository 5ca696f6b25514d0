"""The plan: in memory (Plan, RankPlan), on disk (the plan file), streamed an epoch ahead
(RankStream), proven before it runs (validate). See solar/schedule/README.md."""
