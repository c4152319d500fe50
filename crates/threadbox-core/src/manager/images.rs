//! The image catalog.

use super::*;

impl Manager {
    pub async fn add_image(&self, caller: &Caller, req: AddImageRequest) -> Result<Image> {
        let target = req.name.clone();
        let r = async {
            caller.require(ops::AddImage::SCOPE)?;

            crate::images::validate_image_name(&req.name)?;
            let path = crate::images::validate_rootfs(&req.path)?;
            let row = ImageRow {
                name: req.name,
                kind: "rootfs".into(),
                path: Some(path.display().to_string()),
                created_at: now_ms(),
            };
            self.store.insert_image(&row).await?;
            self.image_view(row).await
        }
        .await;
        self.audit(caller, ops::AddImage::NAME, &target, &r).await;
        r
    }

    pub async fn list_images(&self, caller: &Caller) -> Result<ImageList> {
        caller.require(ops::ListImages::SCOPE)?;

        let mut images = Vec::new();
        for r in self.store.list_images().await? {
            images.push(self.image_view(r).await?);
        }
        Ok(ImageList { images })
    }
}
