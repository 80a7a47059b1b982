"""Checks on every stored sample, and the teacher/reference check on a deterministic fraction.

Run on what is stored (the decoded bytes about to be published), so they check the file, not the capture.
Cheap checks, every sample (names as they appear in ``HiddenIndexRecord.failed``):

- ``shape``: aux [T, n_aux*H], final [T, H], T = the merged row's length;
- ``ids``: stored input_ids and loss_mask equal the merged row's, exactly;
- ``finite``: no NaN or Inf;
- ``norm``: every per-token L2 norm of every slot in [min_token_norm, max_token_norm];
- ``aux_distinct``: each pair of aux slots differs by at least ``min_rel_diff`` (mean per-token relative
  difference ||a-b|| / max(||a||, ||b||));
- ``aux_embedding``: no aux slot is (close to) the input embeddings of the ids.

Which samples get the teacher check (``teacher_fraction`` of them): with a backend that computes the states
itself (hf: ``teacher_selected``), those whose sha256(sample_id) falls under the fraction, the same ones on every
run; with a backend whose states and reference come from a server (vllm, ``SpotChecking``), a ``SpotCheck``
draws them after each answer from the operating system's random source, so nothing a server sees (the request,
the question asked, the sample id) tells it which ones are checked (``spot_checked`` picks the rule).

Teacher check, on the selected samples: the target's final norm
and lm_head applied to the stored final state give log p(input_ids[t+1]) at each completion position t
(loss_mask[t+1] == 1); their mean must beat chance log(1/V) by ``teacher_min_margin`` nats
(``teacher_chance``). The backend's reference (``target.Reference``) is the target's own log-probs at the
same positions: its serving engine's ``prompt_logprobs`` (vllm) or a plain forward pass (hf). Then:

- ``teacher_reference`` (the log-prob check): the mean |difference| from the reference's log-probs must stay
  within the tolerance of the stored dtype, calibrated on the sample itself (``logprob_tolerance``): a final
  state after the norm, from another layer or shifted by a position is off by far more;
- ``teacher_aux``: each stored aux slot, run on through the target's remaining layers (where the backend can:
  ``Reference.through``), must give the reference's log-probs within its own calibrated tolerance (catches
  an off-by-one layer, aux states not captured or shifted);

and with a plain forward (``Reference.hidden``), also:

- ``reference_aux``: each stored aux slot equals the plain forward's ``output_hidden_states[id]``;
- ``reference_final``: RMSNorm(stored final) equals the plain forward's post-norm ``hidden_states[L]``.

Tolerance of the state comparisons (relative, mean per token): ``teacher_tolerance`` or the larger of the
storage and compute dtypes' (fp32 1e-3, bf16/fp16 3e-2, fp8 8e-2). Tolerance of the log-prob comparisons:
``LOGPROB_MARGIN`` × the mean log-prob change that a seeded uniform relative perturbation of the compared
state causes, at the scale of the storage dtype's unit roundoff plus the compute dtype's accumulated over the
target's layers (fp32 2^-24, fp16 2^-11, bf16 2^-8, fp8 2^-4; × sqrt(L) for compute), and at least
``LOGPROB_FLOOR`` nats (``logprob_tolerance``). Storage rounding alone moves the log-probs by 0.7-0.9 of its
own perturbation measure; a final state after the norm or one layer off moves them 8-100× further on the
test targets (bf16), about 2× at fp8. Pure computation: no I/O.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from draftgen.hidden.format import require
from draftgen.records import TeacherResult

if TYPE_CHECKING:
    import torch

    from draftgen.config.hidden import HiddenStatesConfig
    from draftgen.hidden.format import LoadedSample
    from draftgen.target import ExtractBackend, ExtractRow, Reference, TargetInfo

__all__ = ["CHECKS", "LOGPROB_FLOOR", "LOGPROB_MARGIN", "SPOT_BLOCK", "STOPPING", "CheckResult", "SpotCheck",
           "SpotChecking", "check_sample", "check_teacher", "default_tolerance", "logprob_tolerance", "perturbed",
           "relative_diff", "spot_checked", "teacher_selected", "tolerance_of"]

CHECKS = ("shape", "ids", "finite", "norm", "aux_distinct", "aux_embedding", "teacher_chance", "teacher_reference",
          "teacher_aux", "reference_aux", "reference_final")

_TOLERANCE = {"fp32": 1e-3, "bf16": 3e-2, "fp16": 3e-2, "fp8": 8e-2}
#: unit roundoff of each dtype (relative spacing of its values): the log-prob check's noise scale
_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8, "fp8": 2.0**-4}
LOGPROB_MARGIN = 2.0
LOGPROB_FLOOR = 1e-4
_PERTURBATION = 2.0**-8  # the relative perturbation ``perturbed`` applies (at most, per element)


@dataclass
class CheckResult:
    failed: list[str] = field(default_factory=list)
    teacher: TeacherResult | None = None


def default_tolerance(dtype: str, compute: str = "fp32", configured: float | None = None) -> float:
    """``configured``, else the larger of the storage dtype's and the compute dtype's tolerance."""
    if configured is not None:
        return configured
    return max(_TOLERANCE.get(dtype, 3e-2), _TOLERANCE.get(compute, 3e-2))


def teacher_selected(sample_id: str, fraction: float) -> bool:
    """Deterministic by sample_id: the same samples are checked on every run and machine (a backend that
    computes the states itself: nothing to hide the choice from)."""
    if fraction >= 1.0:
        return True
    if fraction <= 0.0:
        return False
    return int(hashlib.sha256(sample_id.encode()).hexdigest()[:8], 16) / 0x1_0000_0000 < fraction


#: a ``SpotCheck`` checks exactly round(fraction x SPOT_BLOCK) of every SPOT_BLOCK samples in answer order (at
#: least one; a fraction under 1/SPOT_BLOCK: one of every round(1 / fraction))
SPOT_BLOCK = 100
#: the checks whose failure on a server's sample is evidence against the server, not against the sample: the
#: states disagree with the engine's own log-probs of the same request
STOPPING = ("teacher_reference", "teacher_aux")


class SpotCheck:
    """The samples a server's answers get the teacher check for, chosen after each answer (``next()``, in
    answer order): exactly ``per_block`` of every ``block`` consecutive answers, their places in the block
    drawn from ``random.SystemRandom`` (the operating system's source: no seed, nothing in a request or a
    sample id predicts it). A server that alters a share p of its samples is caught in each block with the
    probability that a drawn place lands on one of them; one that alters every sample it cannot tell apart
    is caught in its first block. Thread-safe."""

    def __init__(self, fraction: float, rng: random.Random | None = None) -> None:
        self.fraction = min(max(fraction, 0.0), 1.0)
        if 0.0 < self.fraction < 1.0:
            self.block = SPOT_BLOCK if self.fraction * SPOT_BLOCK >= 1 else round(1 / self.fraction)
            self.per_block = max(1, round(self.fraction * self.block))
        else:
            self.block, self.per_block = 1, int(self.fraction >= 1.0)
        self._rng = rng or random.SystemRandom()
        self._lock = threading.Lock()
        self._n = 0
        self._places: set[int] = set()

    def next(self) -> bool:
        """Whether the answer just received is checked."""
        with self._lock:
            k = self._n % self.block
            if k == 0:
                self._places = set(self._rng.sample(range(self.block), self.per_block))
            self._n += 1
            return k in self._places


@runtime_checkable
class SpotChecking(Protocol):
    """A capture backend that chooses its samples' teacher checks itself (``SpotCheck``), after each answer:
    ``teacher_selected(sample_id)`` says whether that sample's last capture was chosen."""

    def teacher_selected(self, sample_id: str) -> bool: ...


def spot_checked(backend: object, sample_id: str, fraction: float) -> bool:
    """Whether ``sample_id``'s states get the teacher check: the backend's own choice (``SpotChecking``), else
    ``teacher_selected``."""
    if isinstance(backend, SpotChecking):
        return backend.teacher_selected(sample_id)
    return teacher_selected(sample_id, fraction)


def relative_diff(a: torch.Tensor, b: torch.Tensor, norms: tuple[torch.Tensor, torch.Tensor] | None = None) -> float:
    """Mean over tokens of ||a_t - b_t|| / max(||a_t||, ||b_t||) (0 where both are zero); ``norms``: the
    per-token norms of ``a`` and ``b`` (float32) when the caller has them already."""
    torch = require("torch")
    a, b = a.float(), b.float()
    num = (a - b).norm(dim=-1)
    na, nb = norms if norms is not None else (a.norm(dim=-1), b.norm(dim=-1))
    den = torch.maximum(na, nb)
    rel = torch.where(den > 0, num / den.clamp_min(1e-30), torch.zeros_like(num))
    return float(rel.mean()) if rel.numel() else 0.0


def _finite(x: torch.Tensor) -> bool:
    """No NaN or Inf in ``x``: its max and min are finite (NaN propagates through both; no [T, W] mask)."""
    torch = require("torch")
    return not x.numel() or bool(torch.isfinite(x.amax()) and torch.isfinite(x.amin()))


def _slots(s: LoadedSample, n_aux: int) -> list[torch.Tensor]:
    return list(s.aux.chunk(n_aux, dim=-1)) if n_aux else []


def check_sample(s: LoadedSample, row: ExtractRow, backend: ExtractBackend, hs: HiddenStatesConfig,
                 *, teacher: bool) -> CheckResult:
    """Every check of one stored sample (see the module docstring); ``teacher`` runs the teacher check."""
    torch = require("torch")
    info = backend.info
    n_aux, H = len(info.layers.aux), info.hidden_size
    res = CheckResult()
    fail = res.failed
    T = len(row.input_ids)
    if tuple(s.aux.shape) != (T, n_aux * H) or tuple(s.final.shape) != (T, H):
        fail.append("shape")
        return res  # nothing below can be read in the right place
    if not (torch.equal(s.input_ids, torch.from_numpy(row.input_ids).to(torch.int64))
            and torch.equal(s.loss_mask, torch.from_numpy(row.loss_mask).to(torch.uint8))):
        fail.append("ids")
    if not (_finite(s.aux) and _finite(s.final)):
        fail.append("finite")
        return res
    slots = _slots(s, n_aux)
    slot_norms = [x.norm(dim=-1) for x in slots]  # per token, each computed once for the checks below
    norms = torch.cat([*slot_norms, s.final.norm(dim=-1)])
    if norms.numel() and (float(norms.min()) < hs.min_token_norm or float(norms.max()) > hs.max_token_norm):
        fail.append("norm")
    if any(relative_diff(slots[i], slots[j], (slot_norms[i], slot_norms[j])) < hs.min_rel_diff
           for i in range(n_aux) for j in range(i + 1, n_aux)):
        fail.append("aux_distinct")
    emb = backend.embed(row.input_ids).float()
    emb_norm = emb.norm(dim=-1)
    if any(relative_diff(x, emb, (n, emb_norm)) < hs.min_rel_diff for x, n in zip(slots, slot_norms, strict=True)):
        fail.append("aux_embedding")
    if teacher:
        check_teacher(s, row, backend, hs, res)
    return res


def check_teacher(s: LoadedSample, row: ExtractRow, backend: ExtractBackend, hs: HiddenStatesConfig,
                  res: CheckResult) -> None:
    """The teacher check of a sample ``check_sample`` checked without it, into ``res`` (its result): skipped, as
    there, when the sample's shape or values are unreadable (``shape`` / ``finite`` failed)."""
    if "shape" in res.failed or "finite" in res.failed:
        return
    res.teacher = _teacher(s, row, backend, hs, res.failed)


def perturbed(state: torch.Tensor) -> torch.Tensor:
    """``state`` (float32) times 1 + a seeded uniform relative perturbation of at most 2^-8 per element: the
    state ``logprob_tolerance`` measures the log-prob check's noise with (the same for the same shape)."""
    th = require("torch")
    gen = th.Generator().manual_seed(0)
    noise = (th.rand(state.shape, generator=gen) * 2 - 1) * _PERTURBATION
    out: torch.Tensor = state.float() * (1 + noise)
    return out


def tolerance_of(moved: float, dtype: str, compute: str = "fp32", depth: int = 1) -> float:
    """The log-prob check's tolerance from ``moved``, the mean |log-prob change| that ``perturbed`` causes:
    scaled (it is linear in the perturbation) to the rounding of the storage dtype plus that of the compute
    dtype accumulated over ``depth`` layers (× sqrt(depth)), times ``LOGPROB_MARGIN``; at least
    ``LOGPROB_FLOOR``."""
    u0 = _PERTURBATION
    u = _ROUNDOFF.get(dtype, u0) + _ROUNDOFF.get(compute, u0) * math.sqrt(max(depth, 1))
    return max(LOGPROB_MARGIN * moved * u / u0, LOGPROB_FLOOR)


def logprob_tolerance(logprobs_of: Callable[[torch.Tensor], torch.Tensor], state: torch.Tensor,
                      base: torch.Tensor, dtype: str, compute: str = "fp32", depth: int = 1) -> float:
    """The log-prob check's tolerance for ``state`` (see the module docstring): ``tolerance_of`` the mean
    |log-prob change| from ``base`` (the log-probs of ``state``) that ``perturbed(state)`` causes."""
    return tolerance_of(float((logprobs_of(perturbed(state)) - base).abs().mean()), dtype, compute, depth)


def _teacher(s: LoadedSample, row: ExtractRow, backend: ExtractBackend, hs: HiddenStatesConfig,
             fail: list[str]) -> TeacherResult:
    torch = require("torch")

    info = backend.info
    chance = -math.log(info.vocab_size)
    mask = torch.from_numpy(row.loss_mask[1:].astype("bool"))  # position t predicts t+1
    pos = torch.nonzero(mask)[:, 0]
    if 0 < hs.teacher_positions < pos.numel():  # evenly spaced, first and last included: deterministic
        pos = pos[torch.linspace(0, pos.numel() - 1, hs.teacher_positions).round().long()]
    targets = torch.from_numpy(row.input_ids[1:]).to(torch.int64)
    if pos.numel() == 0:
        return TeacherResult(logprob_mean=0.0, chance_logprob=chance, positions=0)
    # the stored final state and its perturbed twin (the tolerance's) through the head in one call
    n = int(pos.numel())
    both = backend.head_logprobs(torch.cat([s.final[pos], perturbed(s.final[pos])]), targets[pos].repeat(2))
    lp, lp_moved = both[:n], both[n:]
    mean = float(lp.mean())
    if hs.teacher_min_margin is not None and mean < chance + hs.teacher_min_margin:
        fail.append("teacher_chance")
    out = TeacherResult(logprob_mean=mean, chance_logprob=chance, positions=int(pos.numel()))
    ref = backend.reference(row, pos)
    if ref is None:
        return out
    ref_lp = ref.logprobs.float()
    out.reference_logprob_mean = float(ref_lp.mean())
    out.reference_source = ref.source
    out.logprob_err = float((ref_lp - lp).abs().mean())
    out.logprob_tol = tolerance_of(float((lp_moved - lp).abs().mean()), s.dtype, hs.compute_dtype, info.num_layers)
    if out.logprob_err > out.logprob_tol:
        fail.append("teacher_reference")
    slots = _slots(s, len(info.layers.aux))
    if ref.through is not None and slots:
        out.aux_logprob_err = _aux_through(slots, info, ref, s.dtype, hs.compute_dtype, fail)
    if ref.hidden:
        _reference_states(s, slots, info, ref, default_tolerance(s.dtype, hs.compute_dtype, hs.teacher_tolerance),
                          out, fail)
    return out


def _aux_through(slots: list[torch.Tensor], info: TargetInfo, ref: Reference, dtype: str, compute: str,
                 fail: list[str]) -> float:
    """``teacher_aux``: each aux slot run on through the target's remaining layers (see the module docstring);
    returns the worst slot's mean |difference| (nats)."""
    torch = require("torch")
    through = ref.through
    assert through is not None
    worst, bad = 0.0, False
    for x, k in zip(slots, info.layers.aux, strict=True):
        got, moved = through(k, torch.stack([x.float(), perturbed(x)]))  # the slot and its tolerance's twin
        err = float((got - ref.logprobs.float()).abs().mean())
        worst = max(worst, err)
        bad = bad or err > tolerance_of(float((moved - got).abs().mean()), dtype, compute, info.num_layers)
    if bad:
        fail.append("teacher_aux")
    return worst


def _reference_states(s: LoadedSample, slots: list[torch.Tensor], info: TargetInfo, ref: Reference, tol: float,
                      out: TeacherResult, fail: list[str]) -> None:
    """``reference_aux`` and ``reference_final``: the stored states against a plain forward's."""
    from draftgen.drafter.hf import rms_norm

    errs = [relative_diff(x, ref.hidden[k]) for x, k in zip(slots, info.layers.aux, strict=True)]
    out.aux_max_rel_err = max(errs) if errs else 0.0
    if out.aux_max_rel_err > tol:
        fail.append("reference_aux")
    if ref.post_norm is not None:
        out.final_max_rel_err = relative_diff(rms_norm(s.final, info.norm_weight, info.norm_eps), ref.post_norm)
        if out.final_max_rel_err > tol:
            fail.append("reference_final")
