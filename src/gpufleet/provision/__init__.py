"""The provisioning service: owns what a booting machine is served (iPXE script, cloud-init
user-data) and its one-boot join token, checked against the Machine inventory.

:mod:`.service` (the HTTP API) over :mod:`.issuer` (find the Machine, check who asks, issue
the token), :mod:`.index` (Machines by MAC, from a watch), :mod:`.render`, :mod:`.ratelimit`,
:mod:`.cluster`; :mod:`.inventory` loads the data centre's machine list (the ``machines`` command).
"""
