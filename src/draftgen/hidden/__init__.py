"""The hidden-state set, the contract between ``extract`` and ``train``: the file format and store
(``hidden.format``), the stream (``hidden.stream``: a Sink takes batches of samples and closes with the
manifest, a Source yields a finished set's samples verified; ``hidden_url``, where a config's set is), its
exports to the peer trainers (``hidden.exports``, sinks fed by a Source; ``hidden.export_folder``, an export
folder's ownership and verification), the one writer of speculators' inputs (``hidden.speculators``: the Arrow
dataset, ``token_freq.pt``, ``sample_ids.jsonl``), the target's final norm (``hidden.norm``), one writer per
destination (``hidden.lock``) and the disk estimate that ``plan`` and ``merge`` print (``hidden.estimate``)."""
