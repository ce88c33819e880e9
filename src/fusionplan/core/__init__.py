"""Descriptors, operators, enums, errors and settings: pure data and validation, importing nothing above."""
