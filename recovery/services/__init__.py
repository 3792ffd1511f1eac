"""Write paths of the recovery core, one module per entity."""
