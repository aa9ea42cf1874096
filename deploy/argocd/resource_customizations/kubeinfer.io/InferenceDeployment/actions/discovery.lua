-- promote and abort act on a shadow candidate under test (verdict Pending), as
-- `kubeinfer promote|abort` and `kubectl infd promote|abort` do.
local actions = {}
actions["promote"] = {["disabled"] = true, ["displayName"] = "Promote the shadow candidate"}
actions["abort"] = {["disabled"] = true, ["displayName"] = "Abort the shadow test"}
local candidate = nil
if obj.status ~= nil then
  candidate = obj.status.candidate
end
if candidate ~= nil and candidate.verdict == "Pending" and candidate.engineDigest ~= nil
    and candidate.engineDigest ~= "" then
  actions["promote"]["disabled"] = false
  actions["abort"]["disabled"] = false
end
return actions
