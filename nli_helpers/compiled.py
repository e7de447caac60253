"""What `--torch_compile` adds to a run, imported only then: `torch.compile` set up so that a run
compiles once per kind of shape, and the counters that show it did (metrics.json, `train.compile`).

    >>> net, before = compile_for_training(net, model, device, cfg), counters()
    >>> ...  # the training loop
    >>> counters(before)  # {"graphs": 2, "graph_breaks": 0, "recompiles": 1, ...}

What would compile again, and what this run does instead:
- transformers' sequence classifiers set `config.problem_type` in their first forward; the graph
  guards on it, so the second step would recompile. It is set here first.
- An unpadded batch sent without its mask is another graph: a compiled run always passes the mask
  (`step.model_inputs(..., keep_mask=True)`).
- The epoch's short last batch is another batch size: a compiled run leaves it out
  (`step.LengthGroupedBatches(drop_last=True)`; `dropped_per_epoch` counts the pairs). Every pair is
  still trained on in the epochs where the shuffle puts it elsewhere.
- Widths are padded to multiples of 16: the first width compiles a static graph, the second one
  a graph with a dynamic width that serves every later one (on a GPU, CUDA graphs then record
  once per width).
"""

from __future__ import annotations

import torch

from .config import TrainConfig


def compile_for_training(net, model, device: torch.device, cfg: TrainConfig):
    """`torch.compile`, with CUDA graphs on a GPU ("reduce-overhead": a step's ~1,200 kernel
    launches replayed as one graph). Gradients get stable buffers first, zeroed in place from then
    on (`keeps_grads`): a `.grad` made inside a graph would live in its memory pool, which the next
    replay overwrites, so accumulating over micro-batches would read overwritten sums (torch's own
    advice in `_inductor/cudagraph_trees.py`: preallocate zeroed .grad tensors). Evaluation and
    saving use the eager model underneath."""
    if model.config.problem_type is None:
        model.config.problem_type = "single_label_classification"
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)
    return torch.compile(net, mode="reduce-overhead" if device.type == "cuda" else None)


def counters(since: dict | None = None, loader=None, pairs: int = 0) -> dict:
    """Dynamo's and inductor's counts for this process (minus `since`): graphs compiled, graph
    breaks, recompiles (a frame compiled again: dynamo numbers each frame's compiles), CUDA-graph
    skips (a compiled graph that ran without CUDA graphs, e.g. a CPU tensor input) and re-records;
    with `since`, also the pairs of the training loader's `pairs` that its epochs leave out."""
    from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER
    from torch._dynamo.utils import counters as dynamo

    now = {"graphs": dynamo["stats"]["unique_graphs"],
           "graph_breaks": sum(dynamo["graph_break"].values()),
           "recompiles": sum(n - 1 for n in FRAME_COMPILE_COUNTER.values() if n > 1),
           "cudagraph_skips": dynamo["inductor"]["cudagraph_skips"],
           "cudagraph_rerecords": cudagraph_rerecords()}
    if since is None:
        return now
    dropped = pairs - len(loader) * loader.batch_sampler.size  # an epoch's batches keep the rest
    return {**{key: now[key] - since[key] for key in now}, "dropped_per_epoch": dropped}


def cudagraph_rerecords() -> int:
    """CUDA graphs recorded again after a recorded one no longer fit its inputs (a new width, a
    moved buffer): each is a capture inside the timed steps. torch counts them only in its graph
    tree's manager (`debug_fail_counter`), one per GPU; 0 where no graph was recorded."""
    if not torch.cuda.is_available():
        return 0
    from torch._inductor.cudagraph_trees import get_container

    managers = (get_container(i).tree_manager for i in range(torch.cuda.device_count()))
    return sum(manager.debug_fail_counter for manager in managers if manager is not None)
