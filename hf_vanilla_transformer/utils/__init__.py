"""What every room of the package shares: the machine's description (`machine`), files written atomically
(`files`), and decisions the main process takes for every process of a launch (`distributed`)."""
