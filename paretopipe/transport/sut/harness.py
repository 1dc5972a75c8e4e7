"""One LoadGen test (or a Server search of several) over a running pipeline.

The data source's endpoint owns a :class:`Harness` when its run configuration names a scenario:
the endpoint's schedule takes its batches from the harness's feed instead of a fixed count, and
the harness's thread warms the pipeline up, runs LoadGen's test (whose SUT is the whole pipeline:
a query is issued to the source and completes when its result is back there, on the source's
clock), and ends the feed. A language model's queries are prompts, answered token by token
(:class:`~paretopipe.transport.sut.generations.TokenFeed`); an image model's are batches of
images (:class:`~paretopipe.transport.sut.feed.QueryFeed`). LoadGen writes its logs into a
temporary folder; their text goes into the record's ``loadgen`` part, and whoever writes the
record puts them beside it as files.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ...errors import ParetoPipeError
from ...loadgen import logs, server_search
from ...loadgen.settings import LOADGEN_NAMES, LoadgenOptions, loadgen_version, make_test_settings, require_loadgen
from ..bookkeeping import BatchBook
from ..inputs import SampleSet
from ..runconfig import RunConfig
from .feed import QueryFeed
from .generations import TokenFeed

log = logging.getLogger("paretopipe.loadgen")
#: LoadGen's seeds for a compliant run, from its mlperf.conf (a short run draws its own from --seed).
OFFICIAL_SEEDS = {"qsl_rng_seed": 2085463073848966840, "sample_index_rng_seed": 2747215439041700203,
                  "schedule_rng_seed": 16159082839903944936}
#: Offline's expected rate is the warm-up's times this: a low guess ends its one query before the
#: minimum duration (LoadGen then calls the run INVALID), a high one only makes the run longer.
OFFLINE_SLACK = 1.5


class Harness:
    """LoadGen driving one run's pipeline from its data source."""

    def __init__(self, cfg: RunConfig, builder: Any, book: BatchBook) -> None:
        require_loadgen()
        self.cfg, self.book = cfg, book
        self.opts: LoadgenOptions = cfg.loadgen
        self.feed: QueryFeed | TokenFeed
        if cfg.workload.generates:
            self.feed = TokenFeed(builder, cfg)
        else:
            samples = SampleSet(cfg.dataset, builder.input_size, self.opts.sample_count, cfg.data_dir, cfg.seed,
                                cfg.model)
            offline = self.opts.scenario == "offline"
            self.feed = QueryFeed(samples, cfg.batch_size, None if offline else self.opts.query_size,
                                  keep_predictions=self.opts.mode == "accuracy")
        self.steps: list[dict[str, Any]] = []
        self.figures: dict[str, Any] = {}
        self.texts: dict[str, str] = {}
        self.expected: dict[str, float] = {}
        self.accuracy: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # -- the thread beside the source's schedule ------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="loadgen", daemon=True)
        self._thread.start()

    def stop(self, failed: bool) -> None:
        """After the source's schedule: a failed pipeline answers LoadGen's outstanding samples."""
        if failed:
            self.feed.abandon()
        if self._thread is not None:
            self._thread.join(self.cfg.timeout_s)

    def check(self) -> None:
        """Raise what ended LoadGen's thread, if anything did (after the schedule)."""
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            self._warm_up()
            if self.feed.dead:
                return
            if self.opts.scenario == "server" and self.opts.server_qps is None:
                self._search()
            else:
                fig, texts = self._test(self.opts.server_qps if self.opts.scenario == "server" else None)
                self.figures, self.texts = fig, texts
                if self.opts.scenario == "server":
                    passed = self._passes(fig)
                    self._server_figures(fig if passed else None, self.opts.server_qps if passed else None)
            if self.opts.mode == "accuracy":
                self._accuracy()
        except BaseException as exc:  # ends the schedule; the source raises it after its drain
            self.error = exc
            log.warning("loadgen: %s", exc)
        finally:
            self.feed.end()

    def _passes(self, fig: dict[str, Any]) -> bool:
        """A Server step held its bound (a generation's: both token bounds, its queries kept up)."""
        return server_search.passes(fig, *self.feed.server_bounds(self.opts))

    def _warm_up(self) -> None:
        """The run's warm-up batches, closed loop, before LoadGen's clock starts (a generation's:
        whole queries, :meth:`RunConfig._derive_generation` counts their steps); their latency and
        rate size LoadGen's expectations (SingleStream's latency, Offline's and Server's rate)."""
        n = self.feed.warm_up(self.cfg.warmup)
        deadline = time.monotonic() + self.cfg.timeout_s * max(1, n)
        while self.book.completed < n and not self.feed.dead:
            if time.monotonic() > deadline:
                raise ParetoPipeError(f"loadgen: the warm-up's {n} batches did not complete within "
                                      f"{self.cfg.timeout_s:g} s each")
            time.sleep(0.01)
        done = self.book.records()
        latency, rate = self.feed.expected(done, self.cfg.in_flight, self.opts.scenario)
        self.expected = {"latency_s": latency,
                         "qps": self.opts.expected_qps or rate * (OFFLINE_SLACK if self.opts.scenario == "offline" else 1)}

    def _test(self, server_qps: float | None) -> tuple[dict[str, Any], dict[str, str]]:
        """One LoadGen test; its figures and the text of the logs it wrote."""
        # lazy for start-up: mlperf_loadgen
        import mlperf_loadgen as lg

        settings = make_test_settings(self.opts, expected_latency_s=self.expected["latency_s"],
                                      expected_qps=self.expected["qps"], server_qps=server_qps)
        seeds = OFFICIAL_SEEDS if self.opts.compliant else {k: self.cfg.seed * 3 + i for i, k in enumerate(OFFICIAL_SEEDS)}
        for key, value in seeds.items():
            setattr(settings, key, value)
        folder = Path(tempfile.mkdtemp(prefix="paretopipe-loadgen-"))
        log_settings = lg.LogSettings()
        log_settings.log_output.outdir = str(folder)
        log_settings.log_output.copy_summary_to_stdout = False
        log_settings.enable_trace = False
        total = len(self.feed) if self.opts.mode == "accuracy" else min(self.opts.sample_count, len(self.feed))
        performance = min(self.opts.sample_count, total)
        sut = lg.ConstructSUT(self.feed.issue, self.feed.flush)
        qsl = lg.ConstructQSL(total, performance, self.feed.load_samples, self.feed.unload_samples)
        try:
            log.info("loadgen: %s %s%s, at least %g s", LOADGEN_NAMES[self.opts.scenario], self.opts.mode,
                     f" at {server_qps:.2f} q/s" if server_qps else "", self.opts.min_duration_s)
            lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
        finally:
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
        try:
            fig = logs.figures(logs.read_detail(folder / logs.DETAIL))
            names = logs.KEPT + ((logs.ACCURACY,) if self.opts.mode == "accuracy" else ())
            texts = {n: (folder / n).read_text(errors="replace") for n in names if (folder / n).is_file()}
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return fig, texts

    def _search(self) -> None:
        logs_of: dict[int, dict[str, str]] = {}  # each step's full logs, kept for the one chosen

        def measure(rate: float) -> server_search.Step:
            fig, texts = self._test(rate)
            step = server_search.Step(rate, self._passes(fig), fig)
            tag = f"steps/{len(self.steps):02d}-{rate:.3g}qps"
            self.texts.update({f"{tag}/{logs.SUMMARY}": texts.get(logs.SUMMARY, "")})
            self.steps.append({"target_qps": rate, "passed": step.passed, **fig})
            log.info("loadgen: server at %.2f q/s: p99 %s, %s", rate, _p99_text(fig),
                     "within the bound" if step.passed else "over the bound")
            logs_of[id(step)] = texts
            return step

        done = server_search.search(measure, self.expected["qps"], self.opts.server_steps,
                                    stop=lambda: self.feed.dead)
        passing = server_search.best(done)
        chosen = passing or (done[-1] if done else None)
        if chosen is not None:
            self.figures = chosen.figures
            self.texts.update(logs_of[id(chosen)])
        self._server_figures(passing.figures if passing is not None else None,
                             passing.target_qps if passing is not None else None)

    def _server_figures(self, passing: dict[str, Any] | None, target: float | None) -> None:
        """The Server's result: the rate the pipeline completed in the highest step that held the
        bound (None: none did), and the rate that step asked for. The completed rate, because a
        short run's Poisson arrivals stray from their target, and a rate a little over capacity
        holds a loose bound until the run ends: what was completed within it is what was shown."""
        done = (passing or {}).get("loadgen_samples_per_s")
        self.figures = {**self.figures, "loadgen_server_qps": done if done is not None else target,
                        "loadgen_server_target_qps": target, "loadgen_latency_bound_s": self.opts.latency_bound_s,
                        "loadgen_search_steps": len(self.steps) or 1}
        if self.opts.tokens:
            self.figures.update(loadgen_ttft_bound_s=self.opts.ttft_bound_s, loadgen_tpot_bound_s=self.opts.tpot_bound_s)

    def _accuracy(self) -> None:
        """Top-1 over every sample LoadGen ran once, against the dataset's labels."""
        preds = self.feed.predictions
        right = sum(1 for i, p in preds.items() if self.feed.samples.label(i) == p)
        self.accuracy = {"samples": len(preds), "top1_correct": right,
                         "top1": right / len(preds) if preds else None}
        self.figures = {**self.figures, "loadgen_accuracy_top1": self.accuracy["top1"],
                        "loadgen_accuracy_samples": len(preds)}

    # -- the record ----------------------------------------------------------------------------
    def summary_figures(self) -> dict[str, Any]:
        """What the run's summary adds: the scenario, the settings' standing, LoadGen's figures."""
        return {"loadgen_scenario": self.opts.scenario, "loadgen_mode": self.opts.mode,
                "loadgen_compliance": self.opts.label, **self.figures}

    def part(self) -> dict[str, Any]:
        """The record's ``loadgen`` part (the logs' text, which the writer puts beside the record)."""
        return {"version": loadgen_version(), "options": self.opts.to_dict(), "compliance": self.opts.label,
                "expected": self.expected, "steps": self.steps, "accuracy": self.accuracy,
                "samples_answered": self.feed.answered, "logs": self.texts}


def _p99_text(fig: dict[str, Any]) -> str:
    """A Server step's 99th percentiles in words (a generation's: its first token's and per token's)."""
    def ms(key: str) -> str:
        return f"{(fig.get(key) or 0) * 1e3:.1f} ms"
    if fig.get("loadgen_ttft_p99_s") is not None:
        return f"TTFT {ms('loadgen_ttft_p99_s')}, TPOT {ms('loadgen_tpot_p99_s')}"
    return ms("loadgen_latency_p99_s")
