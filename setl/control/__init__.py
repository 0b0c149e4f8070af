"""What an operator can do to a pipeline, once for every way of asking: the CLI's commands, the
node's HTTP control API (`/api/v1`, `setl.observe.api`) and scripts call the same functions
(`setl.control.actions`); long ones run as operations whose progress is polled (`setl.control.operations`)."""
