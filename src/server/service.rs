//! `sidecar.v1`'s handlers: each takes its request as the edge checked it (`valid`) and runs one
//! library call on the pool ([`SidecarService::run`]) or serves a stream.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::pb::{self, sidecar_server::Sidecar};
use super::valid::{accept, deadline_of, DraftTarget};
use super::{batch, drafting, engine, mixing, score, session, SidecarService};

pub(super) type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Sidecar for SidecarService {
    async fn info(
        &self,
        request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        self.run(deadline_of(&request), engine::info).await
    }

    async fn tokenize(
        &self,
        request: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| engine::tokenize(s, r)).await
    }

    async fn detokenize(
        &self,
        request: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        let deadline = deadline_of(&request);
        let r = request.into_inner();
        self.run(deadline, move |s| engine::detokenize(s, r)).await
    }

    async fn count(
        &self,
        request: Request<pb::CountRequest>,
    ) -> Result<Response<pb::CountResponse>, Status> {
        let (deadline, r) = accept(request, &self.state.limits)?;
        self.run(deadline, move |s| engine::count(s, r)).await
    }

    async fn next_token_distribution(
        &self,
        request: Request<pb::NextTokenDistributionRequest>,
    ) -> Result<Response<pb::NextTokenDistributionResponse>, Status> {
        let (deadline, r) = accept(request, &self.state.limits)?;
        self.run(deadline, move |s| engine::next_token_distribution(s, r))
            .await
    }

    async fn search_documents(
        &self,
        request: Request<pb::SearchDocumentsRequest>,
    ) -> Result<Response<pb::SearchDocumentsResponse>, Status> {
        let (deadline, r) = accept(request, &self.state.limits)?;
        self.run(deadline, move |s| engine::search_documents(s, r))
            .await
    }

    async fn mix(
        &self,
        request: Request<pb::MixRequest>,
    ) -> Result<Response<pb::MixResponse>, Status> {
        let (deadline, r) = accept(request, &self.state.limits)?;
        self.run(deadline, move |s| mixing::mix(s, r)).await
    }

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<pb::GenerateResponse>, Status> {
        let (deadline, r) = accept(request, &self.state.limits)?;
        self.run(deadline, move |s| engine::generate(s, r)).await
    }

    async fn trace(
        &self,
        request: Request<pb::TraceRequest>,
    ) -> Result<Response<pb::TraceResponse>, Status> {
        let (deadline, r) = accept(request, &self.state.limits)?;
        self.run(deadline, move |s| engine::trace(s, r)).await
    }

    async fn hints(
        &self,
        request: Request<pb::HintsRequest>,
    ) -> Result<Response<pb::HintsResponse>, Status> {
        let (deadline, r) = accept(request, &self.state.limits)?;
        self.run(deadline, move |s| engine::hints(s, r)).await
    }

    async fn draft(
        &self,
        request: Request<pb::DraftRequest>,
    ) -> Result<Response<pb::DraftResponse>, Status> {
        let (deadline, r) = accept(request, &self.state.limits)?;
        self.run(deadline, move |s| {
            let tree = match r.target {
                DraftTarget::Session(id) => session::draft(s, id, &r.options)?,
                DraftTarget::Context { ids, extras } => {
                    drafting::draft_context(s, ids, extras, &r.options)?
                }
            };
            Ok(drafting::response(tree))
        })
        .await
    }

    async fn add_documents(
        &self,
        request: Request<pb::AddDocumentsRequest>,
    ) -> Result<Response<pb::AddDocumentsResponse>, Status> {
        let (deadline, r) = accept(request, &self.state.limits)?;
        self.run(deadline, move |s| drafting::add_documents(s, r))
            .await
    }

    type ScoreStream = ResponseStream<pb::ScoreResponse>;

    async fn score(
        &self,
        request: Request<pb::ScoreRequest>,
    ) -> Result<Response<Self::ScoreStream>, Status> {
        let (deadline, r) = accept(request, &self.state.limits)?;
        let stream = score::start(Arc::clone(&self.state), r, deadline)?;
        Ok(Response::new(Box::pin(stream)))
    }

    type SessionStream = ResponseStream<pb::SessionResponse>;

    async fn session(
        &self,
        request: Request<Streaming<pb::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let deadline = deadline_of(&request);
        let stream = session::start(Arc::clone(&self.state), request.into_inner(), deadline)?;
        Ok(Response::new(Box::pin(stream)))
    }

    type BatchStream = ResponseStream<pb::BatchStepResult>;

    async fn batch(
        &self,
        request: Request<Streaming<pb::BatchStep>>,
    ) -> Result<Response<Self::BatchStream>, Status> {
        let deadline = deadline_of(&request);
        let stream = batch::start(Arc::clone(&self.state), request.into_inner(), deadline);
        Ok(Response::new(Box::pin(stream)))
    }
}
