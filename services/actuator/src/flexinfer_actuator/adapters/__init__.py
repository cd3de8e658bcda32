"""Back-ends and other I/O: ``local`` runs model processes on this machine."""
