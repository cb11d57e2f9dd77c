"""The benchmark front end: ``runner`` drives a session over prompt sets in every mode,
``report`` renders tables and charts; ``prompts/`` holds the shipped prompt sets."""
