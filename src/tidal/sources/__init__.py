"""Sources: what ``tidal.Dataset(src, ...)`` reads, found once per job."""
