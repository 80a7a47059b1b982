"""The hidden-state set, the contract between ``extract`` and ``train``: the file format and store
(``hidden.format``), its exports to the peer trainers (``hidden.exports``), and the disk estimate that ``plan``
and ``merge`` print (``hidden.estimate``)."""
