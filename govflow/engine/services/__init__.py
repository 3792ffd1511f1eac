"""Engine write paths, one module per entity."""
