"""Cut points on the torch.fx graph and exact partitions of a model into self-contained stages.

Any position in graph order is a cut. Its *live set* is the tensor values produced before it and
used after it (parameters and buffers do not count): exactly what must cross to the next stage.
Everything before it runs on one stage and everything after on the next, so pooling in
``forward``, skip connections, squeeze-excite and Inception's ``transform_input`` all stay where
they belong; ``nn.Sequential(children())`` slicing silently loses them.

The cuts users know (``cuts``, the block splits) have one live tensor. ``fine_cuts`` holds every
distinct live set, so a cut may sit inside a residual block (the block's input and its branch
cross together) or across a detector's neck. A cut is named by its live set, the tensors' node
names joined with ``+`` in graph order; a stage takes and returns its live sets in that order, and
a tensor used several stages later is carried through the stages in between.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Iterable, Sequence

import torch
from torch import fx, nn
from torch.utils.flop_counter import FlopCounterMode

from ..errors import UsageError
from ..splitspec import check_splits
from .activation import Activation, call_stage, live_tensors
from .blocks import Block, find_blocks
from .detection import Detector, FirstStage, LastStage


INPUT = "input"   # pseudo-cut: everything on the later stage (k = 0 baseline)
OUTPUT = "output"  # pseudo-cut: everything on the earlier stage (k = K baseline)

@dataclasses.dataclass(frozen=True)
class LiveTensor:
    """One tensor of a cut's live set, at the example batch size."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclasses.dataclass(frozen=True)
class CutPoint:
    """One valid cut. ``shape``/``dtype`` are its first live tensor's and ``nbytes`` the whole live
    set's, at the example batch size; FLOPs are per example batch. ``index`` counts the cuts of
    its list (``cuts`` or ``fine_cuts``)."""

    name: str
    index: int
    position: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    flops_before: int
    flops_after: int
    live: tuple[LiveTensor, ...] = ()

    @property
    def width(self) -> int:
        """How many tensors cross this cut."""
        return len(self.live)


def _trace(model: nn.Module) -> fx.GraphModule:
    try:
        return fx.symbolic_trace(model)
    except Exception as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if "/torch/" not in f.filename.replace("\\", "/")]
        where = f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].line})" if frames else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"torch.fx cannot trace {type(model).__name__}{where}: {first}; make forward "
                         f"traceable (no data-dependent control flow) or wrap the model in a builder "
                         f"function that returns a traceable module") from exc


class _Recorder(fx.Interpreter):
    """Runs the graph once, recording each node's output metadata and cumulative FLOPs."""

    def __init__(self, gm: fx.GraphModule, counter: FlopCounterMode) -> None:
        super().__init__(gm)
        self.counter = counter
        self.meta: dict[fx.Node, tuple[bool, tuple[int, ...], str, int, int]] = {}

    def run_node(self, n: fx.Node):
        out = super().run_node(n)
        flops = self.counter.get_total_flops()
        if isinstance(out, torch.Tensor):
            self.meta[n] = (True, tuple(out.shape), str(out.dtype).replace("torch.", ""),
                            out.numel() * out.element_size(), flops)
        else:
            self.meta[n] = (False, (), type(out).__name__, 0, flops)
        return out


class Partitioner:
    """Traces a model once; answers cut-point questions and builds stages for any cut list."""

    def __init__(self, model: nn.Module, example_input: torch.Tensor, model_name: str | None = None):
        self.model = model
        self.model_name = model_name
        # A detector is traced in its backbone and pyramid only; its transform joins the first
        # stage and its heads the last (paretopipe.partition.detection).
        self.pre, self.post = (model.pre, model.post) if isinstance(model, Detector) else (None, None)
        self.traced = model.body if isinstance(model, Detector) else model
        if self.pre is not None:
            with torch.no_grad():
                example_input = self.pre(example_input)
        self.gm = _trace(self.traced)
        self.nodes: list[fx.Node] = list(self.gm.graph.nodes)
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        if len(placeholders) != 1:
            raise UsageError(f"{type(model).__name__} takes {len(placeholders)} inputs; only "
                             f"single-input models can be split")
        self.batch = int(example_input.shape[0]) if example_input.dim() else 1
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            rec = _Recorder(self.gm, counter)
            rec.run(example_input)
        self.total_flops = counter.get_total_flops()
        self._meta = rec.meta
        self.fine_cuts = self._find_cuts()
        self.cuts = [dataclasses.replace(c, index=i) for i, c in enumerate(c for c in self.fine_cuts if c.width == 1)]
        self._by_name = {c.name: c for c in self.fine_cuts} | {c.name: c for c in self.cuts}
        self._node = {n.name: n for n in self.nodes}
        self.blocks: list[Block] = find_blocks(model_name, self.traced, self.nodes, self.cuts, self._cut_at,
                                               self._by_name)

    # -- cut discovery -------------------------------------------------------------------------
    def _find_cuts(self) -> list[CutPoint]:
        """Every distinct live set made of tensors only, at its first position. A live set of the
        input alone is the ``input`` baseline and one of model outputs alone the ``output`` one."""
        index = {n: i for i, n in enumerate(self.nodes)}
        last_use = {n: max((index[u] for u in n.users), default=-1) for n in self.nodes}
        final_values = set(self.nodes[-1].all_input_nodes)
        # Past the last computation only outputs are live: the ``output`` baseline. Before it, a
        # model output may cross beside the rest (a detector's pyramid level that later levels use).
        last_compute = max((i for i, n in enumerate(self.nodes) if n.op.startswith("call_")), default=0)
        live: dict[fx.Node, None] = {}  # insertion order is graph order
        cuts: list[CutPoint] = []
        seen: dict[frozenset[fx.Node], CutPoint] = {}
        self._cut_at: dict[int, CutPoint] = {}  # every position that is a cut: the first cut of its live set
        for pos, node in enumerate(self.nodes[:-1]):
            if node.op != "get_attr" and last_use[node] > pos:
                live[node] = None
            live = {n: None for n in live if last_use[n] > pos}
            key = frozenset(live)
            if key in seen:
                self._cut_at[pos] = seen[key]
                continue
            if not live or (key <= final_values and pos >= last_compute):
                continue
            metas = [self._meta.get(v, (False, (), "", 0, 0)) for v in live]
            if not all(m[0] for m in metas):
                continue  # a shape or a size crosses here: only tensors travel
            if len(live) == 1 and next(iter(live)).op == "placeholder":
                continue
            tensors = tuple(LiveTensor(v.name, m[1], m[2], m[3]) for v, m in zip(live, metas))
            flops = self._meta[node][4]
            cuts.append(CutPoint("+".join(t.name for t in tensors), len(cuts), pos, tensors[0].shape,
                                 tensors[0].dtype, sum(t.nbytes for t in tensors), flops,
                                 self.total_flops - flops, tensors))
            seen[key] = self._cut_at[pos] = cuts[-1]
        return cuts

    def candidate_cuts(self, max_live: int = 1) -> list[CutPoint]:
        """The cuts a sweep may try: those with at most ``max_live`` tensors crossing."""
        if max_live < 1:
            raise UsageError(f"--max-live {max_live}: give 1 or more tensors a cut may carry")
        return [c for c in self.fine_cuts if c.width <= max_live]

    # -- lookups -------------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """K: split_index K puts the whole model on stage 1 (and 0 puts it all on stage 2)."""
        return len(self.blocks) + 1

    def block_cut(self, k: int) -> str:
        """Cut name for anchor split index ``k`` (0..K); ``input``/``output`` for the baselines."""
        K = self.num_blocks
        check_splits([k], K, self.model_name or type(self.model).__name__)
        if k == 0:
            return INPUT
        if k == K:
            return OUTPUT
        return self.blocks[k - 1].cut.name

    def block_cuts(self) -> list[str]:
        """The cut of every block split k = 0..K, in order (``input`` first, ``output`` last)."""
        return [self.block_cut(k) for k in range(self.num_blocks + 1)]

    def boundary_cuts(self, extra: Sequence[str] = ()) -> list[str]:
        """The block cuts and the cuts named in ``extra``, in graph order, each once: the
        boundaries of an adaptive run's self-profile (both stages derive the same list)."""
        named = dict.fromkeys([*self.block_cuts(), *extra])
        return sorted(named, key=self.stage_position)

    def cut(self, name: str) -> CutPoint:
        if name not in self._by_name:
            examples = ", ".join(c.name for c in self.cuts[:5])
            raise UsageError(f"unknown cut {name!r}; valid: {len(self.fine_cuts)} fx cuts such as "
                             f"{examples} (list them with python -m paretopipe.split --list --fine)")
        return self._by_name[name]

    def live_specs(self, name: str) -> list[tuple[tuple[int, ...], str]]:
        """What crosses cut ``name``, tensor by tensor: its shape without the batch and its dtype (a
        receiving stage checks each batch against it before computing)."""
        return [(tuple(self._meta[self._node[n]][1][1:]), self._meta[self._node[n]][2]) for n in self.live_names(name)]

    def live_names(self, name: str) -> list[str]:
        """The node names of what crosses cut ``name``, in the order a stage takes and returns them."""
        if name == INPUT:
            return [self.nodes[0].name]
        if name == OUTPUT:
            return [n.name for n in self.nodes[-1].all_input_nodes]
        return [t.name for t in self.cut(name).live]

    def payload_nbytes(self, name: str, batch: int) -> int:
        """Bytes of the tensor crossing cut ``name`` at ``batch`` images (input for k=0)."""
        if name == OUTPUT:
            return sum(self._meta[n][3] for n in self.nodes[-1].all_input_nodes) // self.batch * batch
        if name == INPUT:
            return self._meta[self.nodes[0]][3] // self.batch * batch
        return self.cut(name).nbytes // self.batch * batch

    # -- stages --------------------------------------------------------------------------------
    def stages(self, cut_names: Sequence[str]) -> list[nn.Module]:
        """N stages for N-1 cuts (names in graph order); ``input``/``output`` make pass-through stages.
        A stage takes its incoming live set as arguments and returns the outgoing one (a tuple when
        several tensors cross)."""
        positions = [self.stage_position(name) for name in cut_names]
        if positions != sorted(positions):
            raise UsageError(f"cuts must be in graph order, got {list(cut_names)}")
        bounds = [(0, [])] + [(p, self._live_nodes(n)) for p, n in zip(positions, cut_names)]
        bounds.append((len(self.nodes) - 1, []))
        stages = [self._stage(a, ins, b, outs) for (a, ins), (b, outs) in zip(bounds, bounds[1:])]
        if self.pre is not None:
            stages[0], stages[-1] = FirstStage(self.pre, stages[0]), LastStage(stages[-1], self.post)
        return stages

    def stage_position(self, name: str) -> int:
        """Where cut ``name`` lies in graph order (``input`` first, ``output`` last)."""
        if name == INPUT:
            return 0
        if name == OUTPUT:
            return len(self.nodes) - 1
        return self.cut(name).position

    def _live_nodes(self, name: str) -> list[fx.Node]:
        return [self._node[n] for n in self.live_names(name)]

    def _stage(self, start: int, incoming: list[fx.Node], stop: int, outgoing: list[fx.Node]) -> nn.Module:
        """Nodes in (start, stop] (the placeholder too when start == 0), taking ``incoming`` and
        returning ``outgoing`` (the model's output when the stage ends the model)."""
        if start == stop:
            return PassThrough()
        last = len(self.nodes) - 1
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        if start > 0:
            for node in incoming:
                env[node] = graph.placeholder(node.name)

        def lookup(node: fx.Node) -> fx.Node:
            if node not in env:
                if node.op != "get_attr":
                    raise RuntimeError(f"stage ({start}, {stop}] needs {node.name} from outside")
                env[node] = graph.node_copy(node, lookup)
            return env[node]

        first = 0 if start == 0 else start + 1
        for node in self.nodes[first:stop + 1]:
            if node.op == "output":
                graph.output(fx.map_arg(node.args[0], lookup))
                break
            env[node] = graph.node_copy(node, lookup)
        if stop != last:
            out = [lookup(n) for n in outgoing]
            graph.output(out[0] if len(out) == 1 else tuple(out))
        stage = fx.GraphModule(self.gm, graph, class_name="Stage")
        stage.eval()
        return stage

    def activation_peak_nbytes(self, cut_names: Sequence[str], index: int, batch: int) -> int:
        """The largest tensor stage ``index`` of ``cut_names`` produces or takes in, at ``batch``
        images (from the traced run's shapes): what its largest live activation occupies."""
        positions = [self.stage_position(n) for n in cut_names]
        bounds = [0] + positions + [len(self.nodes) - 1]
        start, stop = bounds[index], bounds[index + 1]
        sizes = [self._meta[n][3] for n in self.nodes[start:stop + 1] if n in self._meta and self._meta[n][0]]
        return max(sizes, default=0) // self.batch * batch



class PassThrough(nn.Module):
    """An empty stage (two equal cuts, or a baseline): what comes in goes out, one tensor or several."""

    def forward(self, *xs: torch.Tensor) -> Activation:
        return xs if len(xs) != 1 else xs[0]


def cut_points(model: nn.Module, example_input: torch.Tensor) -> list[CutPoint]:
    """Every valid fx cut of ``model`` in graph order."""
    return Partitioner(model, example_input).cuts


def partition(model: nn.Module, cuts: Iterable[str | CutPoint], example_input: torch.Tensor,
              model_name: str | None = None) -> list[nn.Module]:
    """N self-contained stages (each owns its parameters) for N-1 cuts."""
    names = [c.name if isinstance(c, CutPoint) else c for c in cuts]
    return Partitioner(model, example_input, model_name).stages(names)


def run_stages(stages: Sequence[nn.Module], inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        x = inputs
        for stage in stages:
            x = call_stage(stage, x)
        return x


def verify(model: nn.Module, stages: Sequence[nn.Module], inputs: torch.Tensor,
           reference: torch.Tensor | None = None) -> float:
    """Max abs difference between the chained stages and the unsplit model on ``inputs``.

    ``reference`` is the unsplit model's output on ``inputs`` when the caller already has it:
    checking many splits of one model then costs one forward each, not two."""
    if reference is None:
        with torch.no_grad():
            reference = model(inputs)
    got = live_tensors(run_stages(stages, inputs))
    return max(float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
               for a, b in zip(got, live_tensors(reference)))
