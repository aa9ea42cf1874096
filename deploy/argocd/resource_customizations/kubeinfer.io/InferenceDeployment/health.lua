-- Argo CD health of a kubeinfer.io InferenceDeployment, read from the conditions its
-- operator writes (Ready is the summary; Degraded and Progressing tell the rest).
--
--   Progressing  no status yet; status.observedGeneration or the Ready condition's
--                observedGeneration behind metadata.generation (the operator has not
--                acted on the latest spec); otherwise not Ready and not Degraded: an
--                engine building, a shadow test running, a rollout under way
--   Degraded     Degraded=True: a failed build, runtime pods that cannot start, a stalled
--                rollout, a failed or aborted shadow test, quality drift, an invalid spec.
--                It wins over Ready: drift leaves the engine serving (Ready=True) and
--                still needs someone to look
--   Healthy      Ready=True: the spec's engine serves on every desired replica
--
-- Only Lua's base and table libraries are used, so the script also runs as a
-- resource.customizations entry without useOpenLibs.
local hs = {status = "Progressing", message = "Waiting for the operator to report a status"}

local function find(conditions, wanted)
  for _, condition in ipairs(conditions) do
    if condition.type == wanted then
      return condition
    end
  end
  return nil
end

local function said(condition)
  if condition.message ~= nil and condition.message ~= "" then
    return condition.reason .. ": " .. condition.message
  end
  return condition.reason
end

local status = obj.status
if status == nil or status.conditions == nil then
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= generation then
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end
local ready = find(status.conditions, "Ready")
if ready == nil then
  return hs
end
if generation ~= nil and ready.observedGeneration ~= generation then
  hs.message = "Waiting for the Ready condition of generation " .. generation
  return hs
end
local degraded = find(status.conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = said(degraded)
  return hs
end
if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message
  return hs
end
local progressing = find(status.conditions, "Progressing")
if progressing ~= nil and progressing.status == "True" then
  hs.message = said(progressing)
else
  hs.message = said(ready)
end
return hs
