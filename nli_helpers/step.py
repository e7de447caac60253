"""The pieces of one training step and what feeds it, which `train.train` puts together: the
loader of length-grouped, padded batches (`LengthGroupedBatches`, `collator`), the inputs as the
model takes them (no host sync), the optimizer (AdamW, decay by shape) and its step through the
fp16 loss scaler; with `--torch_compile`, the compiled step and the counts that show it compiled
once per kind of shape.

    >>> loader = make_train_loader(tokenized["train"], cfg, tokenizer, device)
    >>> loss = model(**model_inputs(next(iter(loader)), device, model)).loss
"""

from __future__ import annotations

import itertools

import torch
from torch.utils.data import BatchSampler, RandomSampler
from transformers import DataCollatorWithPadding
from transformers.trainer_pt_utils import LengthGroupedSampler

from .config import TrainConfig


def model_inputs(batch: dict, device: torch.device, model, keep_mask: bool = False) -> dict:
    """The batch on `device`, its attention mask in a form the model uses as it is. Given a 2-D
    mask, transformers asks `padding_mask.all()` on every forward whether it may skip masking: a
    host sync per step, which also keeps CUDA graphs out. The collated mask is still on the CPU, so
    the question is answered here for free: an unpadded batch goes without a mask, a padded one with
    the 4-D mask transformers would build (bool for SDPA, additive for eager attention). A compiled
    model always gets the mask (`keep_mask`): a batch without one would compile another graph."""
    mask = batch.get("attention_mask")
    moved = {k: v.to(device, non_blocking=True) for k, v in batch.items() if k != "attention_mask"}
    kind = getattr(model.config, "_attn_implementation", None)
    if mask is None or kind not in ("sdpa", "eager"):  # flash/flex attention take the 2-D mask
        return moved if mask is None else {**moved, "attention_mask": mask.to(device)}
    if mask.numpy().all() and not keep_mask:  # numpy, on the CPU copy: no device, no sync
        return moved
    width = mask.shape[1]
    attend = mask.to(device, non_blocking=True).bool()[:, None, None, :].expand(-1, 1, width, -1)
    if kind == "eager":  # added to the scores: 0 where attended, the dtype's minimum where not
        dtype = next(model.parameters()).dtype
        attend = torch.where(attend, torch.zeros((), dtype=dtype, device=device),
                             torch.finfo(dtype).min)
    return {**moved, "attention_mask": attend}


def optimizer_step(model, optimizer, scheduler, scaler, max_grad_norm: float,
                   keep_grads: bool = False) -> float | None:
    """Clip, step (through the fp16 grad scaler) and schedule. Returns the learning rate used, or
    None when the scaler skipped the step for inf/NaN gradients (the schedule then waits too, as in
    Trainer and accelerate). fp16 pays one host sync a step for that answer, where `get_scale()`
    before and after would be two: the scale stays a device tensor until one comparison is read.
    `keep_grads` zeroes the gradients in place instead of dropping them (a compiled step's stable
    buffers, `compile_for_training`)."""
    if max_grad_norm > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    scale = scaler._scale.clone() if scaler.is_enabled() else None  # set by scaler.scale(loss)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=not keep_grads)
    if scale is not None and bool(scaler._scale < scale):  # update() shrinks it after inf/NaN
        return None
    lr = scheduler.get_last_lr()[0]
    scheduler.step()
    return lr


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig):
    """AdamW, decaying matrices only (`decay_groups`), fused: one pass over weights, gradients and
    both moments (CUDA, and the CPU since torch 2.4; the weights stay fp32 under autocast)."""
    return torch.optim.AdamW(decay_groups(model, cfg.weight_decay), lr=cfg.learning_rate,
                             fused=True)


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """nanoGPT's rule: matrices (dim >= 2: linear and embedding weights) decay; vectors (biases,
    norm weights) do not. Names would miss a norm called `final_norm.weight`; shapes do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def make_train_loader(dataset, cfg: TrainConfig, tokenizer, device: torch.device, *,
                      num_replicas: int = 1, rank: int = 0) -> torch.utils.data.DataLoader:
    """Length-grouped batches of `per_device_train_batch_size` pairs per process, padded by
    transformers' `DataCollatorWithPadding`."""
    # Widths padded to a multiple of 16 for a compiled model (few shapes), of 8 on a GPU (tensor
    # cores), else not at all.
    multiple = 16 if cfg.torch_compile else 8 if device.type == "cuda" else None
    sampler = LengthGroupedBatches(dataset["length"], cfg.per_device_train_batch_size,
                                   seed=cfg.seed, group_by_length=cfg.group_by_length,
                                   num_replicas=num_replicas, rank=rank,
                                   drop_last=cfg.torch_compile)  # one batch size: --torch_compile
    return torch.utils.data.DataLoader(
        model_columns(dataset, tokenizer), batch_sampler=sampler,
        num_workers=cfg.dataloader_num_workers,
        collate_fn=collator(tokenizer, multiple),
        # Its own generator: drawing from the global RNG that dropout uses would give a resumed run
        # other dropout masks than an uninterrupted one.
        generator=torch.Generator().manual_seed(cfg.seed),
        pin_memory=device.type == "cuda", persistent_workers=cfg.dataloader_num_workers > 0)


# -- batches: transformers' length grouping and padding -------------------------------------------
class LengthGroupedBatches(torch.utils.data.Sampler):
    """Each epoch's batches of row numbers, in transformers' `LengthGroupedSampler` order (Trainer's
    `group_by_length`: shuffle, sort mega-batches by length, longest batch first) or torch's random
    one. `batch_size` is per process: each of `num_replicas` ranks takes its share of every global
    batch from the same order, so N processes see exactly the batches one process would (as
    accelerate's `BatchSamplerShard` does). `drop_last` leaves out the epoch's short last batch
    (which pairs that is changes each epoch)."""

    def __init__(self, lengths, batch_size: int, *, seed: int = 0, group_by_length: bool = True,
                 num_replicas: int = 1, rank: int = 0, drop_last: bool = False):
        self.lengths, self.size = list(lengths), batch_size * num_replicas
        self.least = self.size if drop_last else num_replicas  # pairs a batch needs to be kept
        self.seed, self.group, self.replicas, self.rank = seed, group_by_length, num_replicas, rank
        self.epoch = self.skip = 0

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Choose the epoch's order; `skip_batches` resumes mid-epoch (after a checkpoint)."""
        self.epoch, self.skip = epoch, skip_batches

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = LengthGroupedSampler(self.size, lengths=self.lengths, generator=generator) \
            if self.group else RandomSampler(self.lengths, generator=generator)
        # A last batch too small to give every rank a pair is dropped: all ranks step together.
        kept = (b[self.rank::self.replicas] for b in BatchSampler(order, self.size, False)
                if len(b) >= self.least)
        return itertools.islice(kept, self.skip, None)

    def __len__(self) -> int:
        """Batches in a whole epoch (skipped ones included: the loop counts epochs with it)."""
        n = len(self.lengths)
        return n // self.size + (n % self.size >= self.least)


def model_columns(split, tokenizer):
    """The split as the collator takes it: the model's inputs and the label."""
    keep = [c for c in (*tokenizer.model_input_names, "label") if c in split.column_names]
    return split.select_columns(keep)


def collator(tokenizer, multiple: int | None = None) -> DataCollatorWithPadding:
    """Batches padded to their longest pair (to a multiple of `multiple`), labels as `labels`."""
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple, return_tensors="pt")


# -- --torch_compile: compiled once per kind of shape, and the counters that show it did -----------
# (metrics.json's `train.compile`): `compile_for_training(net, model, device, cfg)` and
# `counters()` before the loop, `counters(before, loader, pairs)` after it.
# What would compile again, and what this run does instead:
# - transformers' sequence classifiers set `config.problem_type` in their first forward; the graph
#   guards on it, so the second step would recompile. It is set here first.
# - An unpadded batch sent without its mask is another graph: a compiled run always passes the mask
#   (`model_inputs(..., keep_mask=True)`).
# - The epoch's short last batch is another batch size: a compiled run leaves it out
#   (`LengthGroupedBatches(drop_last=True)`; `dropped_per_epoch` counts the pairs). Every pair is
#   still trained on in the epochs where the shuffle puts it elsewhere.
# - Widths are padded to multiples of 16: the first width compiles a static graph, the second one
#   a graph with a dynamic width that serves every later one (on a GPU, CUDA graphs then record
#   once per width).


def compile_for_training(net, model, device: torch.device, cfg: TrainConfig):
    """`torch.compile`, with CUDA graphs on a GPU ("reduce-overhead": a step's ~1,200 kernel
    launches replayed as one graph). Gradients get stable buffers first, zeroed in place from then
    on (`keep_grads`): a `.grad` made inside a graph would live in its memory pool, which the next
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
