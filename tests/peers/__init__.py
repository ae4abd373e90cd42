"""Other projects' own code, vendored verbatim (with their licence and origin) so rigkit is tested
against what they run, not against a re-statement of their protocol."""
