#!/usr/bin/env python3
"""Which sampler finds a front with the fewest runs: samplers replayed on complete spaces.

Each space is a lookup table holding every configuration's objectives (median latency, min;
throughput, max), so a search "measures" a configuration by reading its row, and what it reached
can be compared with the exhaustive front of the same table:

- ``demo``: the shipped demo session (``examples/session-demo``), one space per network of its
  20 splits. A space this small says little (10% is two configurations); it is replayed because
  it is a real measured one.
- ``plans``: MobileNetV2 in three stages, a Pi, a second Pi and a server, Pi to Pi over the
  ``wifi`` profile and Pi to server over ``lte``: every plan of two cuts at its block boundaries
  (cuts may coincide: a stage may run nothing), four codecs and three batch sizes, 2,520
  configurations. The figures come from the cost model over a device profile measured on this
  machine (``paretopipe profile``, cached), scaled per device (Pi x3, server x0.15). The *truth*
  is the cost model with each device's segment times off by a fixed lognormal factor (sigma
  0.25, what a profile taken elsewhere gets wrong) and per-configuration noise whose coefficient
  of variation is the demo session's run-to-run spread; the *prediction* is the cost model
  without either.

- ``llm/lte`` and ``llm/wifi``: ``smollm2-135m``'s shape split between a Pi (x3) and a server
  (x0.15), every split x wire dtype (float32, float16, int8, int4), 132 configurations, under lte
  with prompts of 512 tokens and under wifi with 128; the objectives are the time to first token
  and per output token from the language model's cost model over a profile measured here
  (``paretopipe profile --model smollm2-135m``, cached), with the same model error and noise as
  ``plans``. (A network or a prompt length is a workload, not a choice: a front spans neither.)

Every sampler runs with each seed twice: from scratch, and seeded by the prediction, as
``paretopipe search`` does: the predicted front, then the next layers of the prediction's
non-dominated sorting, measured first up to half the budget at the 10% mark
(``loop.predicted_first``). The table gives the hypervolume
reached over the exhaustive front's after 5%, 10% and 20% of the space's configurations. The
last line names the sampler (seeded by the prediction) with the best median at 10% of the large
space; the goal is 0.99. ``gp`` (Gaussian-process EHVI) is left out unless named: on this 2-core
machine 40 of its trials took over five minutes.

    python benchmarks/search.py [--samplers tpe,nsga2,qmc,random] [--seeds 3] [--profile FILE] [--truth-seed N]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from paretopipe.analysis import pareto
from paretopipe.network.conditions import get_conditions
from paretopipe.predict.costmodel import LinkModel, chain_terms
from paretopipe.predict.device_profile import DeviceProfile
from paretopipe.search import loop
from paretopipe.search.space import LookupTable, from_table

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "session-demo"
CODECS = ("float32/none", "float16/none", "float32/zstd", "float32/lz4")
BATCHES = (1, 2, 4)
DEVICES = (("pi", 3.0), ("pi2", 3.0), ("server", 0.15))
MODEL_ERROR_SIGMA = 0.25
CHECKPOINTS = (0.05, 0.10, 0.20)
OBJECTIVES = {"latency_s": "min", "throughput_imgs_per_s": "max"}


def measured_noise_cv() -> float:
    """The demo session's run-to-run spread: the median over its configurations of the
    coefficient of variation of their runs' median latency."""
    runs = pd.read_csv(DEMO / "runs.csv")
    runs = runs[runs["status"] == "complete"]
    cv = runs.groupby("config_key")["latency_median_s"].agg(lambda s: s.std() / s.mean() if len(s) > 1 else np.nan)
    return float(cv.dropna().median())


def demo_tables() -> dict[str, LookupTable]:
    summary = pd.read_csv(DEMO / "summary.csv")
    summary = summary.rename(columns={"latency_median_s": "latency_s"})
    return {f"demo/{net}": from_table(grp, ["split_index"], OBJECTIVES, ordered=["split_index"])
            for net, grp in summary.groupby("network")}


def measured_profile(path: Path | None) -> DeviceProfile:
    """This machine's MobileNetV2 profile at batch 1, 2 and 4 with the four codecs (measured once
    and cached)."""
    path = path or ROOT / "results" / "benchmarks" / "search-mobilenetv2.profile.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"measuring a MobileNetV2 profile into {path} (a few minutes)...", flush=True)
        subprocess.run([sys.executable, "-m", "paretopipe", "profile", "--model", "mobilenetv2", "--batch-sizes",
                        ",".join(map(str, BATCHES)), "--codecs", ",".join(CODECS), "--ciphers", "none",
                        "--repetitions", "5", "--threads", "1", "--quiet", "--out", str(path)], check=True)
    return DeviceProfile.load(path)


def scaled(profile: DeviceProfile, factor: float, name: str, errors: np.ndarray | None = None) -> DeviceProfile:
    """``profile``'s device made ``factor`` times slower (compute and codecs), each segment
    further off by ``errors`` (one factor per segment: a profile's error on another device)."""
    doc = copy.deepcopy(profile.doc)
    for batch in doc["by_batch"].values():
        segs = np.asarray(batch["segment_compute_s"], dtype=float) * factor
        if errors is not None:
            segs = segs * errors
        batch["segment_compute_s"] = segs.tolist()
        batch["whole_model_s"] = float(segs.sum())
        for rows in batch["codecs"].values():
            for row in rows:
                row["encode_s"] *= factor
                row["decode_s"] *= factor
    doc["manifest"] = {**doc.get("manifest", {}), "hostname": name}
    return DeviceProfile(doc)


def plan_space(profile: DeviceProfile, noise_cv: float, seed: int = 0
               ) -> tuple[LookupTable, tuple[list[tuple], list[tuple]]]:
    """The three-stage plan space's truth as a lookup table, and every configuration with its
    predicted objectives."""
    rng = np.random.default_rng(seed)
    segments = len(profile.batch(1)["segment_compute_s"])
    predicted = [scaled(profile, f, n) for n, f in DEVICES]
    truth = [scaled(profile, f, n, np.exp(rng.normal(0, MODEL_ERROR_SIGMA, segments))) for n, f in DEVICES]
    wifi_up, wifi_down = LinkModel.pair(get_conditions("wifi"))
    lte_up, lte_down = LinkModel.pair(get_conditions("lte"))
    links, back = [wifi_up, lte_up], [wifi_down, lte_down]
    positions = sorted({int(v) for v in profile.doc["blocks"].values()})
    rows = []
    for i, c1 in enumerate(positions):
        for c2 in positions[i:]:
            for codec in CODECS:
                for b in BATCHES:
                    row = {"cut1": c1, "cut2": c2, "codec": codec, "batch_size": b}
                    for label, profiles in (("predicted_", predicted), ("", truth)):
                        terms = chain_terms(profiles, links, [c1, c2], b, codec, back_links=back)
                        row[f"{label}latency_s"] = terms.latency_s()
                        row[f"{label}throughput_imgs_per_s"] = terms.throughput_imgs_per_s()
                    rows.append(row)
    table = pd.DataFrame(rows)
    sigma = math.sqrt(math.log(1 + noise_cv ** 2))  # a lognormal with that coefficient of variation
    table["latency_s"] *= np.exp(rng.normal(0, sigma, len(table)))
    table["throughput_imgs_per_s"] /= np.exp(rng.normal(0, sigma, len(table)))
    dims = ["cut1", "cut2", "codec", "batch_size"]
    lookup = from_table(table, dims, OBJECTIVES, ordered=["batch_size"], plan=["cut1", "cut2"])
    configs = [tuple(r) for r in table[dims].itertuples(index=False, name=None)]
    pred = table[["predicted_latency_s", "predicted_throughput_imgs_per_s"]].to_numpy()
    return lookup, (configs, [tuple(v) for v in pred])


LM = "smollm2-135m"
LM_PROMPTS = (128, 512)
LM_DTYPES = ("float32", "float16", "int8", "int4")
LM_SPACES = (("lte", 512), ("wifi", 128))
LM_OBJECTIVES = {"ttft_s": "min", "tpot_s": "min"}


def lm_profile(path: Path | None) -> dict:
    """This machine's profile of smollm2-135m's blocks at the space's prompt lengths (measured once, cached)."""
    path = path or ROOT / "results" / "benchmarks" / "search-smollm2-135m.profile.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"measuring a {LM} profile into {path} (a few minutes)...", flush=True)
        subprocess.run([sys.executable, "-m", "paretopipe", "profile", "--model", LM, "--prompt-len",
                        ",".join(map(str, LM_PROMPTS)), "--threads", "1", "--quiet", "--out", str(path)], check=True)
    return json.loads(path.read_text())


def lm_scaled(doc: dict, factor: float, errors: np.ndarray | None = None) -> dict:
    """A language model's profile made ``factor`` times slower, each block further off by ``errors``."""
    out = copy.deepcopy(doc)
    for phase in out["prompt_lens"].values():
        for key in ("prefill_s", "decode_s"):
            times = np.asarray(phase[key], dtype=float) * factor
            phase[key] = (times * errors if errors is not None else times).tolist()
    return out


def lm_space(doc: dict, network: str, prompt: int, noise_cv: float, seed: int = 0
             ) -> tuple[LookupTable, tuple[list[tuple], list[tuple]]]:
    """The language model's space under ``network`` with prompts of ``prompt`` tokens: its truth as
    a lookup table, and every configuration with its predicted objectives."""
    from paretopipe.llm.shapes import shape_of
    from paretopipe.predict import lm_costmodel

    rng = np.random.default_rng(seed)
    shape = shape_of(LM)
    pi, server = DEVICES[0][1], DEVICES[2][1]
    predicted = [lm_scaled(doc, pi), lm_scaled(doc, server)]
    truth = [lm_scaled(doc, f, np.exp(rng.normal(0, MODEL_ERROR_SIGMA, shape.num_blocks))) for f in (pi, server)]
    rows = []
    conditions = get_conditions(network)
    for dtype in LM_DTYPES:
        guess = lm_costmodel.predict(shape, predicted, conditions, prompt, dtype)
        real = lm_costmodel.predict(shape, truth, conditions, prompt, dtype)
        rows += [{"split": g["split"], "dtype": dtype, "predicted_ttft_s": g["predicted_ttft_s"],
                  "predicted_tpot_s": g["predicted_tpot_s"], "ttft_s": r["predicted_ttft_s"],
                  "tpot_s": r["predicted_tpot_s"]} for g, r in zip(guess, real)]
    table = pd.DataFrame(rows)
    sigma = math.sqrt(math.log(1 + noise_cv ** 2))
    for column in LM_OBJECTIVES:
        table[column] *= np.exp(rng.normal(0, sigma, len(table)))
    dims = ["split", "dtype"]
    lookup = from_table(table, dims, LM_OBJECTIVES, ordered=["split"])
    configs = [tuple(r) for r in table[dims].itertuples(index=False, name=None)]
    pred = table[["predicted_ttft_s", "predicted_tpot_s"]].to_numpy()
    return lookup, (configs, [tuple(v) for v in pred])


def replay(name: str, table: LookupTable, samplers: list[str], seeds: int,
           prediction: tuple[list[tuple], list[tuple]] | None) -> list[dict]:
    """Each sampler and seed, from scratch and (where there is a prediction) seeded by it: its
    layers measured first, up to half the budget at the 10% mark."""
    truth = np.array(table.all_values())
    lower, upper = loop.bounds(truth)
    senses = list(table.objectives.values())
    exhaustive = loop.normalised_hypervolume(truth, senses, lower, upper)
    n = len(table)
    marks = [max(1, round(f * n)) for f in CHECKPOINTS]
    predicted = loop.predicted_first(*prediction, senses, budget=marks[CHECKPOINTS.index(0.10)]) if prediction else []
    out = []
    for sampler in samplers:
        for seed in range(seeds):
            for first in (["prediction", "none"] if predicted else ["none"]):
                given = predicted if first == "prediction" else []
                t0 = time.perf_counter()
                result = loop.search(table.space, table.values, table.objectives, budget=max(marks[-1], len(given)),
                                     sampler=sampler, seed=seed, seeds=given)
                wall = time.perf_counter() - t0
                ratios = [result.hypervolume(lower, upper, m) / exhaustive for m in marks]
                out.append({"space": name, "configs": n, "sampler": sampler, "seed": seed, "first": first,
                            **{f"hv_{round(f * 100)}pct": r for f, r in zip(CHECKPOINTS, ratios)},
                            "proposals": result.proposals, "wall_s": wall})
                print(f"{name:14s} {n:5d}  {sampler:7s} seed {seed}  first={first:10s}  "
                      + "  ".join(f"{round(f * 100):2d}%: {r:.4f}" for f, r in zip(CHECKPOINTS, ratios))
                      + f"  ({result.proposals} proposals, {wall:.1f} s)", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samplers", default="tpe,nsga2,qmc,random")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--profile", type=Path, default=None, help="a MobileNetV2 profile at batch 1,2,4 with the four codecs")
    p.add_argument("--only", choices=("demo", "plans", "llm"), default=None)
    p.add_argument("--lm-profile", type=Path, default=None, help=f"a {LM} profile at prompt lengths "
                   f"{','.join(map(str, LM_PROMPTS))}")
    p.add_argument("--truth-seed", type=int, default=0, help="the draw of the profile's error on each device "
                   "and of the run-to-run noise (the plans space's truth)")
    args = p.parse_args()
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    noise = measured_noise_cv()
    print(f"run-to-run noise (demo session, median CV of a configuration's run medians): {noise:.3f}")
    rows: list[dict] = []
    if args.only in (None, "demo"):
        for name, table in demo_tables().items():
            rows += replay(name, table, samplers, args.seeds, None)
    if args.only in (None, "plans"):
        table, prediction = plan_space(measured_profile(args.profile), noise, args.truth_seed)
        front = int(np.sum(pareto.ranks(np.asarray(prediction[1]), ["min", "max"]) == 0))
        print(f"plans: {len(table)} configurations; the predicted front holds {front}", flush=True)
        rows += replay("plans", table, samplers, args.seeds, prediction)
    if args.only in (None, "llm"):
        doc = lm_profile(args.lm_profile)
        for network, prompt in LM_SPACES:
            table, prediction = lm_space(doc, network, prompt, noise, args.truth_seed)
            rows += replay(f"llm/{network}", table, samplers, args.seeds, prediction)
    df = pd.DataFrame(rows)
    print("\nmedian over seeds (hypervolume reached / exhaustive):")
    summary = df.groupby(["space", "first", "sampler"])[[c for c in df.columns if c.startswith("hv_")]].median()
    print(summary.round(4).to_string())
    if args.only in (None, "plans"):
        large = summary.loc[("plans", "prediction")]["hv_10pct"]
        best = max(large.index, key=lambda name: (round(large[name], 4), name == loop.DEFAULT_SAMPLER))
        print(f"search: {best} reaches {large[best]:.4f} of the exhaustive hypervolume with 10% of "
              f"{int(df[df['space'] == 'plans']['configs'].iloc[0])} configurations")
    if args.only in (None, "llm"):
        seeded = df[df["space"].str.startswith("llm/") & (df["first"] == "prediction")]
        # Each sampler's worst space: the median over seeds in each, then the lowest of them.
        lowest = seeded.groupby(["sampler", "space"])["hv_10pct"].median().groupby("sampler").min()
        best = max(lowest.index, key=lambda name: (round(lowest[name], 4), name == loop.DEFAULT_SAMPLER))
        print(f"search ({LM}'s shape): {best} reaches at least {lowest[best]:.4f} of the exhaustive hypervolume "
              f"with 10% of {int(df[df['space'].str.startswith('llm/')]['configs'].iloc[0])} configurations in each "
              f"of {len(LM_SPACES)} spaces")
    print(json.dumps({"noise_cv": noise}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
