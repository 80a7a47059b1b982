"""The target's identity, as a hidden set records it and train --online checks it: ``identity_of`` (name,
revision, config.json and final-norm digests, weights digest) and ``target_weights`` (the digest of the
target's weights, ``hidden.norm.weights_digest``, read from its local folder: safetensors headers and sampled
bytes). Writes nothing.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from draftgen.hidden.norm import WeightsDigest, weights_digest
from draftgen.records import HiddenIdentity, HiddenTarget
from draftgen.target import target_folder

if TYPE_CHECKING:
    from draftgen.config import RunConfig
    from draftgen.target import TargetInfo

__all__ = ["identity_of", "target_weights"]


def target_weights(cfg: RunConfig, folder: str | os.PathLike[str] | None = None) -> WeightsDigest:
    """The digest of the target's weights (``hidden.norm.weights_digest``) in ``folder``, by default the
    target's own folder (``target_folder``: ``hidden_states.model``, or its hub cache snapshot)."""
    if folder is None and not cfg.hidden_states.model:
        return WeightsDigest(sampled=None)  # no target named: the backend refuses to start, naming the key
    return weights_digest(folder if folder is not None else target_folder(cfg))


def identity_of(info: TargetInfo, weights: WeightsDigest | None = None) -> HiddenIdentity:
    """The identity of the target ``info`` describes (name, revision, config.json and final-norm digests) and
    whose weights digest ``weights`` is (None: not known)."""
    norm = hashlib.sha256(info.norm_weight.float().numpy().tobytes()).hexdigest()
    w = weights or WeightsDigest(sampled=None)
    return HiddenIdentity(target=HiddenTarget(name=info.name, revision=info.revision, config_sha256=info.config_sha256,
                                              weights_sha256=w.sampled, files_sha256=w.files),
                          norm_weight_sha256=norm)
