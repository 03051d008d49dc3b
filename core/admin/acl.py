"""mqadmin's ACL commands: updateAclConfig, deleteAclConfig, clusterAclConfigVersion, updateGlobalWhiteAddr, getAclConfig."""
