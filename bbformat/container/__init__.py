"""The bytes of a .bb container: header, chunks, index and footer (SPEC.md sections 3-7)."""
