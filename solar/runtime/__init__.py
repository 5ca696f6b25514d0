"""The runtime: the stages that execute one rank's plan, one step at a time.

Lifecycle (as SPDL separates configure, build and run): :func:`setup.configure` decides the
run from a Loader's arguments and starts nothing; :func:`pipeline.build` composes one
process's stages for it (the modes — transform or not, held transformed, a tier, the first
step read before its plan, a buffer per rank or per node — are decided there, by which objects
are built); and :meth:`pipeline.Pipeline.serve` runs step ``k`` through them. The Loader
(solar/loader.py) keeps the public API, the iteration position, resume and close.

Who owns what (each stage is built with its collaborators, takes a step index or the step's
record, never calls back, and writes its own figures):

==============  ===============================================================================
module          owns
==============  ===============================================================================
setup.py        the run as decided: data, ranks, run, plan inputs agreed, memory checked, keys
steps.py        what step k is: its plan in batch order, rows of batch memory, transfer, the
                transform job, the window's trim (one place: ``Steps.enter``)
memory.py       batch memory (raw and transformed pools) and ``InFlight``, the step's record
reads.py        starting a step's storage and tier reads into its batch memory; the read-ahead
                queue; the read figures
holdings.py     the RAM buffer and the tier, and the step they match (``Holdings.at``); hits
                gathered into a batch; the plan's updates applied; refills. A rank's own
                buffer is a host of one rank; with one buffer per host (a host plan,
                solar/schedule/keep/hostplan.py) a ``Host``: the host's shared buffer and staging
                rows, rows read once for the host, host barriers per step, the host's tier
                one shared file, its hits read at the step
assembly.py     a step's batch from its reads and hits (rows as read)
transforms.py   transformed assemblies: scheduling transforms, steps assembled ahead, the
                refill of held transformed rows
workers.py      the transform workers, threads or processes (one parameter); procs.py the
                processes' shared memory
remote.py       a trainer's transforms shared with preprocessing workers on other hosts
                (solar/remote): a worker's steps taken as delivered, the late or lost ones
                transformed here
delivery.py     trim or exchange (equal batches), the dict, extras, ``batch_transform``
pipeline.py     the per-process object: the stages composed, one step run, its figures recorded
==============  ===============================================================================

Where a sample's bytes are read: the executor's tasks (solar/io/executor.py), started by
``reads.Reads``. Where the decision to keep them is made: the planner (solar/schedule), which
this package obeys. Where they are copied into a batch: reads land in the batch's rows, and
``Holdings.gather`` copies the hits.
"""
