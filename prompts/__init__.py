"""The prompt files shipped with agentstream (YAML; see :mod:`agentstream.declarations.prompts`)."""
