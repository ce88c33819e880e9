"""Every operator as plain torch ops: the reference of the tests, the driver and the bench, and the CPU path."""
