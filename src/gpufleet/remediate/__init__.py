"""Action drivers shared by the products: owns how a remediation step reaches the hardware
(Redfish BMC reset, power cycle, reimage boot), never whether it should happen.

:mod:`.steps` carries out one BMC step attempt with a write-ahead mark (:mod:`.evidence`)
before its one Reset POST; :mod:`.redfish` is the BMC client; :mod:`.identity` checks the BMC
answers for the machine the cluster expects.
"""
