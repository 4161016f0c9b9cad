"""Predicted tokens/step of the head's static DP tree and its best dynamic settings at the same budgets (run from
the repository root): the calibration and acceptance profiles of this folder; the latency profile is only the
shape the predictor asks for (tokens/step do not depend on it)."""
import os
HERE = os.path.dirname(os.path.abspath(__file__))
from sequoia_opt.profiles import load_acceptance, load_latency
from sequoia_opt.profiles.calibration import load_calibration
from sequoia_opt.solver.dynamic import predict_setting, setting_grid
from sequoia_opt.solver.depth import solve_profile
cal = load_calibration(HERE + '/calibration-eagle3.yaml')
acc = load_acceptance(HERE + '/acceptance-eagle3.yaml')
curve = load_latency('results/drafters/2026-12-01T004921Z/latency.yaml')  # T(n) shape only: tokens/step do not use it
for B in (4, 6, 8, 12):
    sol, model = solve_profile(acc, B, 6, 4)
    g = sol.expected_tokens()
    grid = [s for s in setting_grid(cal, budgets=(B,)) if s.budget == B]
    best = sorted(grid, key=lambda s: -predict_setting(cal, s, curve, context=256).tokens_per_step)[:3]
    print(B, model, 'static', round(g, 3), [(s.label, round(predict_setting(cal, s, curve, context=256).tokens_per_step, 3)) for s in best])
