"""Expert placement heuristics: LPT and its swap refinement (:mod:`.lpt`), the row-aware
refinement against a fixed layout (:mod:`.refine`), the joint placement-and-packing search
(:mod:`.joint`) and the migration cost of changing a materialized placement (:mod:`.migration`)."""
