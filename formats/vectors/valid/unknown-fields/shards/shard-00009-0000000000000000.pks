a stale file no manifest lists
