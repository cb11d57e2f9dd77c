"""A loaded target/draft pair and what needs one: which pair to load (``pair``), loading it
(``open``, ``loading``), its prompts (``prompts``, ``chat_template``, ``tools``,
``constraints``, ``prompt_state``) and the session around the engine (``session``). Builds
on core, backend, models, storage and this machine's facts (``machine``); every front end
(api, bench, tui, serve, cli) goes through it."""
