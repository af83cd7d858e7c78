//! The gRPC server: binds the endpoint, then serves Identity and, as
//! configured, Controller and Node until shutdown.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use strata_volume::Engine;

use crate::driver_config::DriverConfig;
use crate::{controller, identity, node, proto};

/// The endpoint, listening; nothing answered yet.
pub struct Bound {
    listener: tokio::net::UnixListener,
    config: Arc<DriverConfig>,
}

/// Listens on `config.endpoint` (a stale socket replaced): an error here
/// stops `strata csi` before it serves anything.
pub fn bind(config: DriverConfig) -> anyhow::Result<Bound> {
    let listener = config.endpoint.bind()?;
    Ok(Bound {
        listener,
        config: Arc::new(config),
    })
}

impl Bound {
    /// Serves the CSI services until `shutdown` resolves, then removes the
    /// socket.
    pub async fn serve(
        self,
        engine: Arc<Engine>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let config = self.config;
        let identity = identity::IdentityService::new(config.clone());
        let mut router = tonic::transport::Server::builder()
            .add_service(proto::identity_server::IdentityServer::new(identity));
        if config.controller {
            let controller = controller::ControllerService::new(engine.clone(), config.clone());
            router =
                router.add_service(proto::controller_server::ControllerServer::new(controller));
        }
        if config.node {
            let node = node::NodeService::new(engine.clone(), config.clone());
            router = router.add_service(proto::node_server::NodeServer::new(node));
        }
        tracing::info!(endpoint = %config.endpoint, node = %config.node_id, controller = config.controller, node_service = config.node, "CSI endpoint ready");
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(self.listener);
        let result = router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .with_context(|| format!("CSI endpoint {}", config.endpoint));
        config.endpoint.remove();
        result
    }
}
