"""What identifies a configuration across its runs, stated once: the configuration key (its
fields are summary.csv's key columns), its text in file names and run keys, a panel of figures,
and the defaults a table from before a field existed means by its absence."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Sequence

from .. import engines, faults, records
from ..loadgen.settings import CLOSED_LOOP
from ..splitspec import Split, sort_key

#: A configuration's cipher when its record (or a table from before encryption) names none.
PLAIN = "none"
#: A configuration's transport when its record (or a table from before transports) names none.
RAW_TCP = "tcp"
DEFAULT_CODEC = "float32/none"
#: A configuration of image batches has no prompt (a language model's generation names its length).
NO_PROMPT = 0
#: A configuration without a fault (paretopipe.faults) as its treatment.
NO_FAULT = faults.NONE
#: A configuration whose stages ran on the testbed's first hosts in the order .env lists them (or
#: on this machine): a sweep without --placements.
NO_PLACEMENT = "in-order"
#: A configuration whose stages computed in eager PyTorch (paretopipe.engines): every one before engines.
DEFAULT_ENGINE = engines.TORCH


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    """What identifies a configuration: runs of one configuration differ only in ``run``. The one
    statement of it: its fields, in order, are summary.csv's key columns (:data:`CONFIG_KEY`, what
    tables group by); :attr:`text` is its form in file names, run keys and failures.csv; the
    sweeper keys each configuration's stopping rule by it."""

    model: str
    backend: str
    cipher: str
    transport: str
    network: str
    batch_size: int
    split_index: Any  # the split's label (:attr:`paretopipe.splitspec.Split.label`): 3, "3,9", a cut, "adaptive"
    codec: str = DEFAULT_CODEC   # how activations travel: --wire-dtype/--compression (a search may vary it)
    in_flight: int = 1           # --in-flight (a search may vary it); a generation's streams
    scenario: str = CLOSED_LOOP  # the LoadGen scenario (paretopipe.loadgen), or the closed loop
    prompt_len: int = NO_PROMPT  # a generation's prompt tokens per stream (0: image batches)
    fault: str = NO_FAULT        # the fault the runs survived (paretopipe.faults), or none
    placement: str = NO_PLACEMENT  # the hosts its stages ran on, in order (placement_label), or in order
    engine: str = DEFAULT_ENGINE   # the engine its stages computed on (one, or one per stage joined by "+")

    def __post_init__(self) -> None:
        object.__setattr__(self, "split_index", split_label(self.split_index))

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> "ConfigKey":
        """The key of a runs.csv or summary.csv row (or a run row before it is written)."""
        return cls(*key_values(row))

    @property
    def text(self) -> str:
        """``model_backend_network_k03[_cipher][_transport]``: without the batch size, which one sweep fixes."""
        return config_key(self.model, self.backend, self.network, self.split_index, self.cipher, self.transport,
                          self.codec, scenario=self.scenario, prompt_len=self.prompt_len, fault=self.fault,
                          placement=self.placement, engine=self.engine)


CONFIG_KEY = [f.name for f in dataclasses.fields(ConfigKey)]
#: What a row from before ciphers, transports, codecs, scenarios or prompts in the key means by their absence.
KEY_DEFAULTS = {"cipher": PLAIN, "transport": RAW_TCP, "codec": DEFAULT_CODEC, "in_flight": 1, "scenario": CLOSED_LOOP,
                "prompt_len": NO_PROMPT, "fault": NO_FAULT, "placement": NO_PLACEMENT, "engine": DEFAULT_ENGINE}
#: Key columns a table writes only where some row has a value of its own (an image sweep's tables
#: keep the columns they had before language models).
OPTIONAL_KEY = {"prompt_len": NO_PROMPT, "fault": NO_FAULT, "placement": NO_PLACEMENT, "engine": DEFAULT_ENGINE}


def placement_label(devices: Sequence[int]) -> str:
    """A placement's text: the hosts' places in .env's HOSTS from 1, in stage order (``1-3-2``)."""
    return "-".join(str(i + 1) for i in devices)


def placement_devices(label: Any) -> tuple[int, ...] | None:
    """The hosts (indices into HOSTS, from 0) of a :func:`placement_label`; None for
    :data:`NO_PLACEMENT` (the first hosts in order, as many as the split has stages)."""
    if label == NO_PLACEMENT or label != label or label is None:
        return None
    return tuple(int(part) - 1 for part in str(label).split("-"))


def key_values(row: Mapping[str, Any]) -> tuple:
    """A row's :data:`CONFIG_KEY` values in order (a row from before ciphers, transports, codecs or
    in-flight depths in the key: plain, raw TCP, float32 uncompressed, one in flight)."""
    return tuple(row[k] if k in row and row[k] == row[k] else KEY_DEFAULTS[k] for k in CONFIG_KEY)


def table_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A table's columns in first-seen order, but an optional key column that no row sets apart
    from its default (an image sweep's summary.csv has no ``prompt_len``)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    return [c for c in columns if not (c in OPTIONAL_KEY and all(r.get(c, OPTIONAL_KEY[c]) == OPTIONAL_KEY[c]
                                                                for r in rows))]


#: One panel of figures: every network and split of one model, backend, cipher, transport, batch
#: size, codec, window, load and prompt length.
PANEL_KEY = ["model", "backend", "cipher", "transport", "batch_size", "codec", "in_flight", "scenario", "prompt_len",
             "fault", "placement", "engine"]


def config_key(model: str, backend: str, network: str, split: Any, cipher: str = PLAIN,
               transport: str = RAW_TCP, codec: str = DEFAULT_CODEC, batch_tag: int | None = None,
               in_flight_tag: int | None = None, scenario: str = CLOSED_LOOP, prompt_len: int | None = None,
               fault: str = NO_FAULT, placement: str = NO_PLACEMENT, engine: str = DEFAULT_ENGINE) -> str:
    """The text form of a configuration (file names, failures.csv); a sealed one ends in its cipher,
    one over another transport than raw TCP in the transport's name, then another codec than
    float32 uncompressed (``_float16-zstd``), and a batch size and an in-flight depth where a search
    session holds several (``_b4``, ``_w2``), a LoadGen scenario (``_server``) and a generation's
    prompt length (``_p128``), a fault (``_stage2_kill_20_2``), a placement (``_h1-3-2``) and an engine
    other than torch (``_onnxruntime``): a sweep's names are what they were before codecs were in the key."""
    k = Split.of(split).key
    return records.file_label(f"{model}_{backend}_{network}_{k}" + (f"_{cipher}" if cipher != PLAIN else "")
                              + (f"_{transport}" if transport != RAW_TCP else "")
                              + (f"_{codec.replace('/', '-')}" if codec != DEFAULT_CODEC else "")
                              + (f"_b{int(batch_tag)}" if batch_tag is not None else "")
                              + (f"_w{int(in_flight_tag)}" if in_flight_tag is not None else "")
                              + (f"_{scenario}" if scenario != CLOSED_LOOP else "")
                              + (f"_p{int(prompt_len)}" if prompt_len else "")
                              + (f"_{fault}" if fault != NO_FAULT else "")
                              + (f"_h{placement}" if placement != NO_PLACEMENT else "")
                              + (f"_{engine}" if engine != DEFAULT_ENGINE else ""))


def panel_names(key: Sequence[Any], depths: bool = False) -> tuple[str, str]:
    """(title, file stem) of one panel of figures, a ``PANEL_KEY`` tuple; a plain panel keeps the
    names it had before ciphers."""
    model, backend, cipher, transport, batch, *rest = key
    codec = rest[0] if rest else DEFAULT_CODEC
    # The in-flight depth is named only where the table holds several (``depths``, a search that
    # varied it): a sweep's figures keep the names they had before it was in the key.
    depth = int(rest[1]) if depths and len(rest) > 1 and rest[1] == rest[1] else 1
    scenario = rest[2] if len(rest) > 2 and isinstance(rest[2], str) else CLOSED_LOOP
    prompt = int(rest[3]) if len(rest) > 3 and rest[3] == rest[3] and rest[3] else NO_PROMPT
    fault = rest[4] if len(rest) > 4 and isinstance(rest[4], str) else NO_FAULT
    placement = rest[5] if len(rest) > 5 and isinstance(rest[5], str) else NO_PLACEMENT
    engine = rest[6] if len(rest) > 6 and isinstance(rest[6], str) else DEFAULT_ENGINE
    sealed = cipher not in (PLAIN, None) and cipher == cipher  # NaN: a table without the column
    carried = transport not in (RAW_TCP, None) and transport == transport
    coded = codec not in (DEFAULT_CODEC, None) and codec == codec
    title = (f"{model}, {backend} backend" + (f" over {transport}" if carried else "")
             + (f", sealed with {cipher}" if sealed else "")
             + (f", prompt {prompt} tokens" if prompt else f", batch {batch}") + (f", {codec}" if coded else "")
             + (f", {depth} in flight" if depth != 1 else "")
             + (f", under LoadGen {scenario}" if scenario != CLOSED_LOOP else "")
             + (f", fault {fault}" if fault != NO_FAULT else "")
             + (f", on hosts {placement}" if placement != NO_PLACEMENT else "")
             + (f", engine {engine}" if engine != DEFAULT_ENGINE else ""))
    return title, records.file_label(f"{model}_{backend}" + (f"_{cipher}" if sealed else "")
                                     + (f"_{transport}" if carried else "") + (f"_p{prompt}" if prompt else f"_b{batch}")
                                     + (f"_{str(codec).replace('/', '-')}" if coded else "")
                                     + (f"_w{depth}" if depth != 1 else "")
                                     + (f"_{scenario}" if scenario != CLOSED_LOOP else "")
                                     + (f"_{fault}" if fault != NO_FAULT else "")
                                     + (f"_h{placement}" if placement != NO_PLACEMENT else "")
                                     + (f"_{engine}" if engine != DEFAULT_ENGINE else ""))


def run_key(cfg_key: str, run: int) -> str:
    return f"{cfg_key}_r{run}"


def split_label(split: Any) -> Any:
    """runs.csv's ``split_index`` of a record's split (:attr:`Split.label`); none stays none."""
    return None if split is None else Split.of(split).label


#: Block splits in numeric order, then N-stage plans, then ``adaptive`` (any written form).
split_sort_key = sort_key


def ordered_splits(values: Iterable[Any]) -> list[Any]:
    return sorted(dict.fromkeys(values), key=split_sort_key)
