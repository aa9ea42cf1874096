-- The shadow test's manual gate, as `kubeinfer abort` writes it: the annotation
-- kubeinfer.io/shadow-gate = "abort <digest>", naming the candidate's engine, so the
-- operator acts on that candidate only (a newer one that raced this action is left
-- alone). Only an annotation is written, never the spec.
local candidate = nil
if obj.status ~= nil then
  candidate = obj.status.candidate
end
if candidate == nil or candidate.verdict ~= "Pending" or candidate.engineDigest == nil
    or candidate.engineDigest == "" then
  error("no candidate under shadow test to abort", 0)
end
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["kubeinfer.io/shadow-gate"] = "abort " .. candidate.engineDigest
return obj
