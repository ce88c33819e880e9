"""The kernel templates: each generated kernel's source and the function that renders it for a plan."""
