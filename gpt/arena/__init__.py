"""The arena: attention designs trained side by side at equal tokens or FLOPs, over seeds, with significance
(arena, plan, runs, stats, report, plots); and time to loss, the recipes' race to a target loss."""
