"""A LoadGen scenario's options, checked, and the ``TestSettings`` LoadGen runs them with.

Short settings are the default, so a sweep of every split stays short; such a run is marked
"not MLPerf-compliant" in its record and report. ``compliant`` applies the MLPerf Inference edge
rules (600 s a run, and each scenario's minimum queries) and refuses settings below them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import strict
from ..errors import UsageError

#: A configuration measured by the suite's own closed loop, not under a LoadGen scenario.
CLOSED_LOOP = "closed"
SCENARIOS = ("singlestream", "multistream", "offline", "server")
MODES = ("performance", "accuracy")
#: LoadGen's names of the scenarios.
LOADGEN_NAMES = {"singlestream": "SingleStream", "multistream": "MultiStream", "offline": "Offline",
                 "server": "Server"}
#: The edge rules: at least 600 s a run, and at least these queries (Offline: samples in its one
#: query), from the MLPerf Inference rules (section "Scenarios") and LoadGen's mlperf.conf.
COMPLIANT_MIN_DURATION_S = 600.0
COMPLIANT_MIN_QUERIES = {"singlestream": 1024, "multistream": 662, "offline": 24576, "server": 270336}
#: The short defaults a sweep uses unless told otherwise.
SHORT_MIN_DURATION_S = 5.0
SHORT_MIN_QUERIES = 64
#: The percentile each scenario's latency is judged at (LoadGen's mlperf.conf).
PERCENTILES = {"singlestream": 90.0, "multistream": 99.0, "offline": 90.0, "server": 99.0}
NOT_COMPLIANT = "not MLPerf-compliant"
#: A language model's Server bounds when none are given: MLPerf's for Llama 2 70B (2 s to the first
#: token, 200 ms a token after it).
DEFAULT_TTFT_BOUND_S = 2.0
DEFAULT_TPOT_BOUND_S = 0.2
#: The scenarios MLPerf measures a language model in (a generation's query is one prompt).
TOKEN_SCENARIOS = ("singlestream", "offline", "server")


@dataclasses.dataclass(frozen=True)
class LoadgenOptions:
    """One LoadGen scenario over a pipeline.

    ``sample_count`` is the query sample library's size (the distinct inputs held in memory);
    ``samples_per_query`` MultiStream's query size; ``latency_bound_s`` the Server's bound on the
    99th percentile; ``server_qps`` a fixed Server rate (None: search for the highest rate within
    the bound, at most ``server_steps`` LoadGen runs); ``expected_qps`` Offline's expected rate
    (None: from the warm-up).

    A language model's queries are prompts, answered token by token (``tokens``, set by the run's
    generation): LoadGen then times the first token and each one after it, and a Server holds the
    99th percentiles of both within ``ttft_bound_s`` and ``tpot_bound_s``."""

    scenario: str
    mode: str = "performance"
    min_duration_s: float = SHORT_MIN_DURATION_S
    min_query_count: int = SHORT_MIN_QUERIES
    compliant: bool = False
    sample_count: int = 64
    samples_per_query: int = 8
    latency_bound_s: float = 0.1
    server_qps: float | None = None
    server_steps: int = 7
    expected_qps: float | None = None
    ttft_bound_s: float | None = None
    tpot_bound_s: float | None = None
    tokens: bool = False

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise UsageError(f"--scenario {self.scenario!r}: valid {', '.join(SCENARIOS)}")
        if self.mode not in MODES:
            raise UsageError(f"--loadgen-mode {self.mode!r}: valid {', '.join(MODES)}")
        if not self.min_duration_s > 0:
            raise UsageError(f"--min-duration-s {self.min_duration_s:g}: give a positive number of seconds")
        if self.min_query_count < 1:
            raise UsageError(f"--min-query-count {self.min_query_count}: give at least 1")
        if self.sample_count < 1:
            raise UsageError(f"--sample-count {self.sample_count}: give at least 1 sample")
        if self.samples_per_query < 1:
            raise UsageError(f"--samples-per-query {self.samples_per_query}: give at least 1")
        if not self.latency_bound_s > 0:
            raise UsageError(f"--latency-bound-ms {self.latency_bound_s * 1e3:g}: give a positive bound")
        if self.server_qps is not None and not self.server_qps > 0:
            raise UsageError(f"--server-qps {self.server_qps:g}: give a positive rate (queries per second)")
        if not 1 <= self.server_steps <= 30:
            raise UsageError(f"--server-steps {self.server_steps}: valid 1..30 LoadGen runs")
        if self.expected_qps is not None and not self.expected_qps > 0:
            raise UsageError(f"--expected-qps {self.expected_qps:g}: give a positive rate")
        for flag, bound in (("--ttft-ms", self.ttft_bound_s), ("--tpot-ms", self.tpot_bound_s)):
            if bound is not None and not bound > 0:
                raise UsageError(f"{flag} {bound * 1e3:g}: give a positive bound")
        if self.tokens:
            self._check_tokens()
        if self.compliant:
            self._check_compliant()

    def _check_tokens(self) -> None:
        """What a generation's queries allow: MLPerf's language-model scenarios, performance only."""
        if self.scenario not in TOKEN_SCENARIOS:
            raise UsageError(f"--scenario {self.scenario}: a language model's queries are prompts, one a query; "
                             f"valid {', '.join(TOKEN_SCENARIOS)}")
        if self.mode == "accuracy":
            raise UsageError("--loadgen-mode accuracy checks an image classifier's top-1 against labels; a language "
                             "model's lossy wire is measured by --eval-samples (teacher-forced perplexity)")

    def for_tokens(self) -> "LoadgenOptions":
        """These options for a generation's queries (the Server's token bounds set, defaulted)."""
        return dataclasses.replace(self, tokens=True, ttft_bound_s=self.ttft_bound_s or DEFAULT_TTFT_BOUND_S,
                                   tpot_bound_s=self.tpot_bound_s or DEFAULT_TPOT_BOUND_S)

    def query_bound_s(self, gen_tokens: int) -> float:
        """The latency a query must keep within: the bound, or for a generation of ``gen_tokens``
        tokens its first token's bound plus one per-token bound for each token after it."""
        if not self.tokens:
            return self.latency_bound_s
        return self.ttft_bound_s + max(0, gen_tokens - 1) * self.tpot_bound_s

    def _check_compliant(self) -> None:
        """The edge rules, each broken one refused by name (accuracy mode runs every sample once,
        so its duration is not the rules' concern)."""
        if self.mode == "accuracy":
            return
        if self.min_duration_s < COMPLIANT_MIN_DURATION_S:
            raise UsageError(f"--mlperf-compliant: --min-duration-s {self.min_duration_s:g} is below the edge rules' "
                             f"{COMPLIANT_MIN_DURATION_S:g} s; give 600 or more, or drop --mlperf-compliant")
        need = COMPLIANT_MIN_QUERIES[self.scenario]
        if self.min_query_count < need:
            what = "samples" if self.scenario == "offline" else "queries"
            raise UsageError(f"--mlperf-compliant: --min-query-count {self.min_query_count} is below the edge rules' "
                             f"{need} {what} for {self.scenario}; give {need} or more, or drop --mlperf-compliant")

    @classmethod
    def of_flags(cls, scenario: str, *, compliant: bool = False, min_duration_s: float | None = None,
                 min_query_count: int | None = None, **rest: Any) -> "LoadgenOptions":
        """Options from flags that may be unset: an unset duration or query count is the short
        default, or the edge rules' under ``compliant``."""
        if min_duration_s is None:
            min_duration_s = COMPLIANT_MIN_DURATION_S if compliant else SHORT_MIN_DURATION_S
        if min_query_count is None:
            min_query_count = COMPLIANT_MIN_QUERIES[scenario] if compliant and scenario in SCENARIOS \
                else SHORT_MIN_QUERIES
        return cls(scenario=scenario, compliant=compliant, min_duration_s=min_duration_s,
                   min_query_count=min_query_count, **{k: v for k, v in rest.items() if v is not None})

    @property
    def label(self) -> str:
        """How a record and a report say what the settings were."""
        return "MLPerf edge rules" if self.compliant else NOT_COMPLIANT

    @property
    def max_test_s(self) -> float:
        """The longest one LoadGen test of these settings may run (a short run's cap; a compliant
        one has none of its own, so twice its minimum)."""
        return 2 * self.min_duration_s + 60 if self.compliant else max(4 * self.min_duration_s, self.min_duration_s + 60)

    @property
    def longest_s(self) -> float:
        """The longest a whole run may take: every test of a Server search, or the one test."""
        tests = self.server_steps if self.scenario == "server" and self.server_qps is None else 1
        return tests * (self.max_test_s + 30)

    @property
    def query_size(self) -> int:
        """Samples in one query of a scenario that issues queries of a fixed size (Offline: None)."""
        return self.samples_per_query if self.scenario == "multistream" else 1

    def to_dict(self) -> dict[str, Any]:
        return strict.to_dict(self)

    @classmethod
    def from_dict(cls, data: Any, what: str = "loadgen options") -> "LoadgenOptions":
        return strict.from_dict(cls, data, what)


def make_test_settings(opts: LoadgenOptions, *, expected_latency_s: float, expected_qps: float,
                  server_qps: float | None = None) -> Any:
    """LoadGen's ``TestSettings`` for ``opts``: its scenario and mode, the duration and query
    count, and the expectations LoadGen sizes a run by (a SingleStream's latency, an Offline's
    rate, a Server's target rate and bound)."""
    # lazy for start-up: mlperf_loadgen
    import mlperf_loadgen as lg

    s = lg.TestSettings()
    s.scenario = getattr(lg.TestScenario, LOADGEN_NAMES[opts.scenario])
    s.mode = lg.TestMode.AccuracyOnly if opts.mode == "accuracy" else lg.TestMode.PerformanceOnly
    s.min_duration_ms = int(round(opts.min_duration_s * 1e3))
    s.min_query_count = opts.min_query_count
    if not opts.compliant:  # a short run is capped, so that a slow pipeline cannot hold a sweep
        s.max_duration_ms = int(opts.max_test_s * 1e3)
    s.single_stream_expected_latency_ns = max(1, int(expected_latency_s * 1e9))
    s.single_stream_target_latency_percentile = PERCENTILES["singlestream"] / 100
    s.multi_stream_expected_latency_ns = max(1, int(expected_latency_s * opts.samples_per_query * 1e9))
    s.multi_stream_samples_per_query = opts.samples_per_query
    s.multi_stream_target_latency_percentile = PERCENTILES["multistream"] / 100
    # Offline's one query holds max(min_query_count, 1.1 x duration x this rate) samples.
    s.offline_expected_qps = expected_qps
    s.server_target_qps = server_qps or expected_qps
    s.server_target_latency_ns = int(opts.latency_bound_s * 1e9)
    s.server_target_latency_percentile = PERCENTILES["server"] / 100
    if opts.tokens:  # each query's first token and the tokens after it timed (FirstTokenComplete)
        s.use_token_latencies = True
        s.ttft_latency = int(opts.ttft_bound_s * 1e9)
        s.tpot_latency = int(opts.tpot_bound_s * 1e9)
    return s


def loadgen_version() -> str:
    try:
        from importlib.metadata import version

        return version("mlcommons-loadgen")
    except Exception:  # the version is a label; a missing one says so
        return "unknown"


def require_loadgen() -> None:
    """Refuse, in one line, a scenario on a host without LoadGen."""
    try:
        # lazy for start-up: mlperf_loadgen
        import mlperf_loadgen  # noqa: F401
    except ImportError:
        raise UsageError("--scenario needs MLCommons LoadGen on the data source's host: pip install mlcommons-loadgen "
                         "(on a Pi, with g++ and python3-dev installed, it builds from source)")
