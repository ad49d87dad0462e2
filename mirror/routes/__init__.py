"""HTTP routes: turn service results into Hub-shaped responses. Routes never touch the store, index or httpx."""
