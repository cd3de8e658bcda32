"""The proxy's decisions, free of I/O: route resolution, queue admission, the wait queue, when to signal demand,
and the errors it answers with. Everything here is a pure function of its arguments (time is passed in)."""
