"""Raw passthrough: ``/upstream/<model>/<engine path>``, a request relayed to the model's
own engine as the client wrote it, on the paths that engine serves to it
(:mod:`.paths`), and its answer relayed as the engine gave it (:mod:`.endpoint`)."""
