"""What localspec keeps on disk between processes, none of it needing a loaded model: the
user's datastores (``datastore``, ``indexing``, ``library``, ``sources``), the history of
answers (``history``, ``answers``), tokenizer fingerprints (``fingerprint``), what ``auto``
learned per pair (``learning``), saved conversations (``conversations``), bounded reading of
text files (``textfile``) and the private-file helpers all of them write through
(``store``). Builds on core and models; the session attaches it to a loaded pair."""
