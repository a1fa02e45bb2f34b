"""Tool-call families: one module each, a `ToolFamily` and its `FamilyState` (see `parsers/family.py`)."""
