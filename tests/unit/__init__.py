"""Pure unit tests: no server, no process."""


def param_id(value: object) -> str:
    """A test id that is the same in every process: ``repr``, but ``object()`` for a bare object.

    A bare object's repr holds its address, which differs between pytest-xdist
    workers, and xdist refuses to run when the workers collect different ids.
    """
    return "object()" if type(value) is object else repr(value)
