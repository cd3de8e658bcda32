"""The ``flexinfer`` command line.

How the package is laid out, one rule for every command:

- :mod:`flexinfer_cli.cli` is the Typer app and what commands share (options with kubectl's names, output formats,
  exit codes, running a command's coroutine).
- ``commands/<verb>.py`` is the command ``flexinfer <verb>`` and only its surface: its arguments and options, their
  help, what it prints and with which exit code. It holds no decision of its own: it parses the command line, reads
  what the work needs from the APIs, calls the work, and prints the result.
- The work of a command lives in one module per concern, beside ``cli.py``, named for what it is rather than for
  the verb (so ``commands/apply.py`` and the plan it executes never share a name), and it never imports Typer:

  ========================  =====================================================================================
  ``flexinfer apply``       :mod:`~flexinfer_cli.apply_plan`: manifests -> the admin API calls, in order; executes
  ``flexinfer delete``      :mod:`~flexinfer_cli.delete_plan`: resources or KIND NAME -> the deleting calls
  ``flexinfer describe``    :mod:`~flexinfer_cli.descriptions`: a model's or a group's page (pure)
  ``flexinfer demand``      :mod:`~flexinfer_cli.demand_signal`: a Demand message published on NATS
  ``flexinfer lease``       :mod:`~flexinfer_cli.gpu_lease`: acquire, renew, hold a GPU lease around a command
  ``flexinfer simulate``    :mod:`~flexinfer_cli.simulation`: a trace replayed through the real election
  ``flexinfer up``          :mod:`~flexinfer_cli.local_system`: the whole system started on this machine
  ``flexinfer get``         :mod:`~flexinfer_cli.tables` and :mod:`~flexinfer_cli.watching` (shared with others)
  ========================  =====================================================================================

  A command imports its heavy work (the scheduler's planner, the supervisor and embedded servers, NATS) inside its
  function, so ``flexinfer --help`` and shell completion do not load it.
- The rest is shared by several commands: :mod:`~flexinfer_cli.client` (the admin API client),
  :mod:`~flexinfer_cli.config`, :mod:`~flexinfer_cli.completion`, :mod:`~flexinfer_cli.events`,
  :mod:`~flexinfer_cli.supervisor`, :mod:`~flexinfer_cli.embedded`, :mod:`~flexinfer_cli.bus_credentials`.
"""
