-- Which of the lock calls' commands the server's ACL refuses this user:
-- asked of the ACL (`redis.acl_check_cmd`, Redis 7.0 and later), so that
-- nothing is written and no lock is touched.
--
-- KEYS[1] is a key under the lock prefix and KEYS[2] a channel under it
-- (declared as keys, so that reaching this script proves the user may use
-- both names as keys); each ARGV is one command's words, `k` standing for
-- the key and `c` for the channel.
--
-- Every command is asked about whole, with as many words as it takes:
-- Redis 7.0 does not check the count it is given, and a command asked
-- about with too few words crashes the server.
--
-- Returns false on a server too old to ask, else the ARGVs refused or
-- unknown.
if not redis.acl_check_cmd then
  return false
end
local refused = {}
for _, words in ipairs(ARGV) do
  local command = {}
  for word in string.gmatch(words, '%S+') do
    if word == 'k' then
      command[#command + 1] = KEYS[1]
    elseif word == 'c' then
      command[#command + 1] = KEYS[2]
    else
      command[#command + 1] = word
    end
  end
  -- A command the server does not know (renamed away, as managed
  -- services do with CONFIG) raises an error: the client cannot run it
  -- either.
  local known, allowed = pcall(redis.acl_check_cmd, unpack(command))
  if not (known and allowed) then
    refused[#refused + 1] = words
  end
end
return refused
