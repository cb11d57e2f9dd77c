"""The benchmark front end: ``run`` is the whole ``localspec bench`` flow from its typed
arguments (``args``); ``prompts`` loads the prompt sets (shipped in ``prompts/``) and the
user's files, ``modes`` types the decoding modes, ``runner`` runs every prompt in every
mode into ``records``, ``summary`` computes the statistics and ``report`` renders tables,
files and the chart."""
