"""Checks on every stored sample, and the teacher/reference check on a deterministic fraction.

Run on what is stored, so they check the file, not the capture: the values rounded to the storage dtype
(fp8: quantised), either where the states are before they leave the capture device (``state_stats`` in
``target.staging``; ``check_staged`` reads its numbers) or decoded from a file's bytes (``check_sample``); both
compute the same numbers the same way.
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
- ``reference_final``: RMSNorm(stored final) equals the plain forward's post-norm ``hidden_states[L]``;

each within its tolerance, and nearer that state than the neighbouring layers' (id-1, id+1; for the final
RMSNorm(hidden_states[L-1])) and than that state shifted by one position either way.

Tolerance of the state comparisons (relative, mean per token; ``state_tolerance``), calibrated per sample and
state: the backend's second plain forward of the row in another shape (``Reference.twin``: right-padded, masked)
differs from the first by ``noise`` (kernels round differently per shape; random weights amplify it over the
layers), and the tolerance is ``STATE_MARGIN`` (3) × max(noise, compute unit roundoff × sqrt(depth)) + the storage
dtype's unit roundoff (bf16 2^-8, fp16 2^-11, fp8 2^-4, fp32 2^-24); ``teacher_tolerance`` fixes it instead.
The twin forward runs only for a sample with a state (or log-prob) past the tolerance of no noise: the tolerance
grows with the noise, so a sample within that floor passes whatever the twin would say, and costs one forward.
Tolerance of the log-prob comparisons:
``LOGPROB_MARGIN`` × the mean log-prob change that a seeded uniform relative perturbation of the compared
state causes, at the scale of the storage dtype's unit roundoff plus the compute dtype's accumulated over the
target's layers (fp32 2^-24, fp16 2^-11, bf16 2^-8, fp8 2^-4; × sqrt(L) for compute), and at least
``LOGPROB_FLOOR`` nats (``logprob_tolerance``). Storage rounding alone moves the log-probs by 0.7-0.9 of its
own perturbation measure; a final state after the norm or one layer off moves them 8-100× further on the
test targets (bf16), about 2× at fp8.

Provider fidelity (``check_fidelity``, on the samples extract chooses: ``ExtractRow.fidelity`` or
teacher-checked): the same head on the stored final state at the same positions gives the mean log p of the
completion ids and the share of positions where the id the provider emitted is the target's top-1
(``FidelityResult``; not a check: nothing fails, ``target.fidelity`` compares providers). Pure
computation: no I/O.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from draftgen.hidden.format import require
from draftgen.records import FidelityResult, TeacherResult

if TYPE_CHECKING:
    import torch

    from draftgen.config.hidden import HiddenStatesConfig
    from draftgen.hidden.codec import Captured, LoadedSample
    from draftgen.target import ExtractBackend, ExtractRow, Reference, TargetInfo

__all__ = ["CHECKS", "LOGPROB_FLOOR", "LOGPROB_MARGIN", "SPOT_BLOCK", "STATE_MARGIN", "STOPPING", "CheckResult", "SpotCheck",
           "SpotChecking", "check_fidelity", "check_sample", "check_staged", "check_teacher", "logprob_tolerance", "perturbed",
           "relative_diff", "spot_checked", "state_stats", "state_tolerance", "stats_failures", "teacher_selected", "tolerance_of"]

CHECKS = ("shape", "ids", "finite", "norm", "aux_distinct", "aux_embedding", "teacher_chance", "teacher_reference",
          "teacher_aux", "reference_aux", "reference_final")

#: unit roundoff of each dtype (relative spacing of its values): the log-prob check's noise scale
_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8, "fp8": 2.0**-4}
LOGPROB_MARGIN = 2.0
LOGPROB_FLOOR = 1e-4
_PERTURBATION = 2.0**-8  # the relative perturbation ``perturbed`` applies (at most, per element)


@dataclass
class CheckResult:
    failed: list[str] = field(default_factory=list)
    teacher: TeacherResult | None = None
    fidelity: FidelityResult | None = None


#: the state comparison's tolerance is STATE_MARGIN x the noise measured on the sample (``state_tolerance``)
STATE_MARGIN = 3.0


def state_tolerance(noise: float, dtype: str, compute: str = "fp32", depth: int = 1) -> float:
    """The state comparison's tolerance (relative, mean per token) for a state ``depth`` layers deep whose two
    legitimate forwards (the plain one and its twin of another shape) differ by ``noise``: ``STATE_MARGIN`` x
    the larger of ``noise`` and the compute dtype's unit roundoff accumulated over the layers (x sqrt(depth)),
    plus the storage dtype's unit roundoff (rounding a state to it moves each token by at most that fraction
    of its norm)."""
    floor = _ROUNDOFF.get(compute, _PERTURBATION) * math.sqrt(max(depth, 1))
    return STATE_MARGIN * max(noise, floor) + _ROUNDOFF.get(dtype, _PERTURBATION)


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
    return float(_relative_diff(a.float(), b.float(), norms))


def _relative_diff(a: torch.Tensor, b: torch.Tensor, norms: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """``relative_diff`` as a 0-d float32 tensor on the inputs' device (no host sync)."""
    th = require("torch")
    num = (a - b).norm(dim=-1)
    na, nb = norms if norms is not None else (a.norm(dim=-1), b.norm(dim=-1))
    den = th.maximum(na, nb)
    rel = th.where(den > 0, num / den.clamp_min(1e-30), th.zeros_like(num))
    out: torch.Tensor = rel.mean() if rel.numel() else th.zeros((), device=a.device)
    return out


def _finite(x: torch.Tensor) -> torch.Tensor:
    """No NaN or Inf in ``x`` (a 0-d bool on its device): its max and min are finite (NaN propagates through
    both; no [T, W] mask)."""
    th = require("torch")
    out: torch.Tensor = (th.isfinite(x.amax()) & th.isfinite(x.amin()) if x.numel()
                         else th.ones((), dtype=th.bool, device=x.device))
    return out


def _slots(s: LoadedSample, n_aux: int) -> list[torch.Tensor]:
    return list(s.aux.chunk(n_aux, dim=-1)) if n_aux else []


def state_stats(aux: torch.Tensor, final: torch.Tensor, emb: torch.Tensor, n_aux: int) -> torch.Tensor:
    """The numbers the cheap value checks read, computed where the states are (any device, no host sync):
    float32 [finite, lowest token norm, highest token norm, each aux pair's ``relative_diff`` (i < j, in
    order), each aux slot's ``relative_diff`` from the embeddings ``emb``]; ``aux``/``final`` as stored
    (decoded to float32), the norms and differences exactly as ``check_sample`` computed them on the file."""
    th = require("torch")
    slots = list(aux.chunk(n_aux, dim=-1)) if n_aux else []
    dev = final.device
    out = [th.stack([_finite(aux), _finite(final)]).all()]
    slot_norms = [x.norm(dim=-1) for x in slots]  # per token, each computed once for the differences below
    norms = th.cat([*slot_norms, final.norm(dim=-1)])
    inf = th.full((), math.inf, device=dev)
    out += [norms.min(), norms.max()] if norms.numel() else [inf, -inf]
    emb_norm = emb.norm(dim=-1)
    pairs = [(slots[i], slots[j], slot_norms[i], slot_norms[j]) for i in range(n_aux) for j in range(i + 1, n_aux)]
    pairs += [(x, emb, n, emb_norm) for x, n in zip(slots, slot_norms, strict=True)]
    out += [_relative_diff(a, b, (na, nb)) for a, b, na, nb in pairs]
    stats: torch.Tensor = th.stack([x.float() for x in out])
    return stats


def stats_failures(stats: torch.Tensor, n_aux: int, hs: HiddenStatesConfig) -> list[str]:
    """The cheap value checks' failures (``finite``, ``norm``, ``aux_distinct``, ``aux_embedding``) from
    ``state_stats``' numbers: nothing past ``finite`` when a value is not finite."""
    v = [float(x) for x in stats.tolist()]
    if not v[0]:
        return ["finite"]
    fail = []
    if v[1] < hs.min_token_norm or v[2] > hs.max_token_norm:
        fail.append("norm")
    n_pairs = n_aux * (n_aux - 1) // 2
    if any(x < hs.min_rel_diff for x in v[3:3 + n_pairs]):
        fail.append("aux_distinct")
    if any(x < hs.min_rel_diff for x in v[3 + n_pairs:3 + n_pairs + n_aux]):
        fail.append("aux_embedding")
    return fail


def _shape_ids(aux: torch.Tensor, final: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, row: ExtractRow,
               info: TargetInfo) -> list[str]:
    """``shape`` (then nothing else can be read) and ``ids``."""
    torch = require("torch")
    n_aux, H, T = len(info.layers.aux), info.hidden_size, len(row.input_ids)
    if tuple(aux.shape) != (T, n_aux * H) or tuple(final.shape) != (T, H):
        return ["shape"]
    if not (torch.equal(ids.to(torch.int64), torch.from_numpy(row.input_ids).to(torch.int64))
            and torch.equal(mask.to(torch.uint8), torch.from_numpy(row.loss_mask).to(torch.uint8))):
        return ["ids"]
    return []


def check_sample(s: LoadedSample, row: ExtractRow, backend: ExtractBackend, hs: HiddenStatesConfig,
                 *, teacher: bool) -> CheckResult:
    """Every check of one stored sample (see the module docstring); ``teacher`` runs the teacher check."""
    n_aux = len(backend.info.layers.aux)
    res = CheckResult(failed=_shape_ids(s.aux, s.final, s.input_ids, s.loss_mask, row, backend.info))
    if "shape" in res.failed:
        return res  # nothing below can be read in the right place
    emb = backend.embed(row.input_ids).float()
    res.failed += stats_failures(state_stats(s.aux, s.final, emb, n_aux), n_aux, hs)
    if teacher and "finite" not in res.failed:
        check_teacher(s, row, backend, hs, res)
    return res


def check_staged(c: Captured, row: ExtractRow, backend: ExtractBackend, hs: HiddenStatesConfig) -> CheckResult:
    """``check_sample``'s cheap checks of a staged sample (``hidden.codec.Staged``: its states as stored and
    their ``state_stats`` from the capture device), without encoding or decoding it: the same result as
    ``check_sample`` on the file ``encode_sample`` makes of it, teacher check aside."""
    torch = require("torch")
    st = c.staged
    if st is None:
        raise ValueError(f"{c.sample_id}: not staged (target.staging.stage_host stages it)")
    res = CheckResult(failed=_shape_ids(c.aux, c.final, torch.from_numpy(c.input_ids), torch.from_numpy(c.loss_mask),
                                        row, backend.info))
    if "shape" not in res.failed:
        st.wait()
        res.failed += stats_failures(st.stats, len(backend.info.layers.aux), hs)
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


def tolerance_of(moved: float, dtype: str, compute: str = "fp32", depth: int = 1, noise: float = 0.0) -> float:
    """The log-prob check's tolerance from ``moved``, the mean |log-prob change| that ``perturbed`` causes:
    scaled (it is linear in the perturbation) to the rounding of the storage dtype plus that of the compute
    dtype accumulated over ``depth`` layers (× sqrt(depth)) or, when larger, ``noise`` (the relative difference
    of the final state between two legitimate forwards, ``Reference.twin``), times ``LOGPROB_MARGIN``; at least
    ``LOGPROB_FLOOR``."""
    u0 = _PERTURBATION
    u = _ROUNDOFF.get(dtype, u0) + max(_ROUNDOFF.get(compute, u0) * math.sqrt(max(depth, 1)), noise)
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
    pos, targets = _scored_positions(row, hs)
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
    L = info.num_layers
    moved = float((lp_moved - lp).abs().mean())
    out.logprob_tol = tolerance_of(moved, s.dtype, hs.compute_dtype, L)
    if out.logprob_err > out.logprob_tol:  # past the rounding floor: calibrate on the twin's noise
        out.logprob_tol = tolerance_of(moved, s.dtype, hs.compute_dtype, L, _final_noise(ref, L))
    if out.logprob_err > out.logprob_tol:
        fail.append("teacher_reference")
    slots = _slots(s, len(info.layers.aux))
    if ref.through is not None and slots:
        out.aux_logprob_err = _aux_through(slots, info, ref, s.dtype, hs.compute_dtype, fail)
    if ref.hidden:
        _reference_states(s, slots, info, ref, hs, out, fail)
    return out


def _scored_positions(row: ExtractRow, hs: HiddenStatesConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The completion positions t the teacher and fidelity checks score (loss_mask[t+1] == 1: t predicts the
    completion id input_ids[t+1]), at most ``teacher_positions`` of them evenly spaced (first and last
    included: deterministic), and the next ids (int64 [T-1], indexed by t)."""
    torch = require("torch")
    mask = torch.from_numpy(row.loss_mask[1:].astype("bool"))
    pos = torch.nonzero(mask)[:, 0]
    if 0 < hs.teacher_positions < pos.numel():
        pos = pos[torch.linspace(0, pos.numel() - 1, hs.teacher_positions).round().long()]
    return pos, torch.from_numpy(row.input_ids[1:]).to(torch.int64)


def check_fidelity(s: LoadedSample, row: ExtractRow, backend: ExtractBackend, hs: HiddenStatesConfig,
                   res: CheckResult) -> None:
    """Provider fidelity of a stored sample, into ``res.fidelity``: the stored final state through the target's
    final norm and head (``head_agreement``, the teacher check's path; no forward) at the scored positions
    (``_scored_positions``): the mean log p of the completion ids and the share where the id is the target's
    top-1. Nothing when the sample's shape or values are unreadable, or it has no completion position."""
    if "shape" in res.failed or "finite" in res.failed:
        return
    pos, targets = _scored_positions(row, hs)
    if pos.numel() == 0:
        return
    lp, top = backend.head_agreement(s.final[pos], targets[pos])
    res.fidelity = FidelityResult(logprob_mean=float(lp.float().mean()), top1=float(top.float().mean()),
                                  positions=int(pos.numel()))


def _final_noise(ref: Reference, L: int) -> float:
    """The post-norm final state's relative difference between the plain forward and its twin (run now if it
    has not been); 0 without a twin."""
    twin = ref.twin_states()
    return relative_diff(ref.post_norm, twin[L]) if ref.post_norm is not None and L in twin else 0.0


def _aux_through(slots: list[torch.Tensor], info: TargetInfo, ref: Reference, dtype: str, compute: str,
                 fail: list[str]) -> float:
    """``teacher_aux``: each aux slot run on through the target's remaining layers (see the module docstring);
    returns the worst slot's mean |difference| (nats)."""
    torch = require("torch")
    through = ref.through
    assert through is not None
    worst, bad = 0.0, False
    L = info.num_layers
    for x, k in zip(slots, info.layers.aux, strict=True):
        got, moved = through(k, torch.stack([x.float(), perturbed(x)]))  # the slot and its tolerance's twin
        err = float((got - ref.logprobs.float()).abs().mean())
        worst = max(worst, err)
        move = float((moved - got).abs().mean())
        bad = bad or (err > tolerance_of(move, dtype, compute, L)
                      and err > tolerance_of(move, dtype, compute, L, _final_noise(ref, L)))
    if bad:
        fail.append("teacher_aux")
    return worst


def _reference_states(s: LoadedSample, slots: list[torch.Tensor], info: TargetInfo, ref: Reference,
                      hs: HiddenStatesConfig, out: TeacherResult, fail: list[str]) -> None:
    """``reference_aux`` and ``reference_final``: each stored aux slot against the plain forward's
    ``hidden[id]``, RMSNorm(stored final) against its ``post_norm`` (``_compare``); records each difference,
    tolerance and noise in ``out``."""
    from draftgen.drafter.hf import rms_norm

    L = info.num_layers
    aux = [_compare(x, ref.hidden[k], partial(_twin_of, ref, k),
                    [ref.hidden[j] for j in (k - 1, k + 1) if j in ref.hidden], s.dtype, hs, k)
           for x, k in zip(slots, info.layers.aux, strict=True)]
    out.aux_rel_err, out.aux_rel_tol = [a[0] for a in aux], [a[1] for a in aux]
    out.aux_max_rel_err = max(out.aux_rel_err, default=0.0)
    noise = [a[2] for a in aux]
    if not all(a[3] for a in aux):
        fail.append("reference_aux")
    if ref.post_norm is not None:
        below = [rms_norm(ref.hidden[L - 1], info.norm_weight, info.norm_eps)] if L - 1 in ref.hidden else []
        err, out.final_rel_tol, n, ok = _compare(rms_norm(s.final, info.norm_weight, info.norm_eps), ref.post_norm,
                                                 partial(_twin_of, ref, L), below, s.dtype, hs, L)
        out.final_max_rel_err = err
        noise.append(n)
        if not ok:
            fail.append("reference_final")
    out.state_noise = noise


def _twin_of(ref: Reference, layer: int) -> torch.Tensor | None:
    return ref.twin_states().get(layer)


def _compare(stored: torch.Tensor, own: torch.Tensor, twin: Callable[[], torch.Tensor | None],
             wrong: list[torch.Tensor], dtype: str, hs: HiddenStatesConfig,
             depth: int) -> tuple[float, float, float, bool]:
    """One stored state against the plain forward's ``own`` (on its device): (relative difference, tolerance,
    noise, passed). The noise is ``own``'s difference from ``twin()`` (the same state from the second forward),
    measured only when the difference is past the tolerance of no noise (the rounding floor: the tolerance
    grows with the noise, so a state within the floor passes whatever the twin says; its noise is recorded as
    0); the tolerance ``state_tolerance`` of it (``teacher_tolerance`` when set). Passed: within the tolerance
    and nearer ``own`` than each ``wrong`` state (the neighbouring layers') and than ``own`` shifted by a
    position either way: an aux layer off by one, or positions shifted, fail even where the noise is as large
    as the tolerance allows."""
    x = stored.to(own.device)
    err = relative_diff(x, own)
    noise = 0.0
    tol = hs.teacher_tolerance if hs.teacher_tolerance is not None else state_tolerance(
        noise, dtype, hs.compute_dtype, depth)
    if err > tol and hs.teacher_tolerance is None:
        other = twin()
        noise = relative_diff(own, other) if other is not None else 0.0
        tol = state_tolerance(noise, dtype, hs.compute_dtype, depth)
    others = [relative_diff(x, w) for w in wrong]
    if x.shape[0] > 1:
        others += [relative_diff(x[1:], own[:-1]), relative_diff(x[:-1], own[1:])]
    return err, tol, noise, err <= tol and all(err < o for o in others)
