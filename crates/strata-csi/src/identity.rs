//! The Identity service: the driver's name and version, what it offers,
//! and whether it is ready.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::driver_config::DriverConfig;
use crate::ids::DRIVER_NAME;
use crate::proto::identity_server::Identity;
use crate::proto::plugin_capability::{self, service, volume_expansion};
use crate::proto::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};

pub struct IdentityService {
    config: Arc<DriverConfig>,
}

impl IdentityService {
    pub fn new(config: Arc<DriverConfig>) -> IdentityService {
        IdentityService { config }
    }
}

fn service_capability(t: service::Type) -> PluginCapability {
    PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = Vec::new();
        if self.config.controller {
            capabilities.push(service_capability(service::Type::ControllerService));
        }
        if self.config.local_store.is_some() {
            // Volumes of a local store are reachable on its host only.
            capabilities.push(service_capability(
                service::Type::VolumeAccessibilityConstraints,
            ));
        }
        // A volume grows while a pod uses it (`resize_volume` is online;
        // the node grows the filesystem on the mounted device).
        capabilities.push(PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                },
            )),
        });
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        // Serving means the engine is open: the store answered at start.
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
