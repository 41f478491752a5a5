"""Dashboard views, one module per page family; thin: parse, call a selector or service, render."""
