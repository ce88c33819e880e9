"""The command-line tools: the driver, the bench, the cache and tuning tools, and what they share."""
